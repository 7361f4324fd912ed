"""The engine: fires a lifecycle's events on stored entities through a store.

- ``engine``: :class:`Engine`, whose ``fire`` reads as look up, judge, write, announce;
- ``arguments``: every argument checked before anything is read or written (I10);
- ``judge``: which branch of the compiled table an event takes;
- ``writes``: the one compare-and-set write of a transition;
- ``announce``: the signals sent after the commit;
- ``reads`` and ``leases``: the engine's reads and its lease operations;
- ``result``: :class:`FireResult`;
- ``joined``: the caller's transaction (:meth:`Engine.within`);
- ``retention``: :meth:`Engine.prune` and :class:`PruneResult`;
- ``many``: :meth:`Engine.fire_many` (:class:`Fire` items, one transaction).
"""

from __future__ import annotations

from fsm.engine.announce import announce
from fsm.engine.engine import Engine
from fsm.engine.many import Fire
from fsm.engine.result import FireResult
from fsm.engine.retention import PruneResult

__all__ = ["Engine", "Fire", "FireResult", "PruneResult", "announce"]
