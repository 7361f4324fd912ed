"""``fsm inspect``: a read-only, live web page of a store (the ``inspect`` extra).

- ``data``: the read-only queries (bound parameters only);
- ``pages``: the HTML, every database value escaped;
- ``timeline``: one entity's timeline (transitions, reaper moves, effects, lease renewals folded by holder);
- ``app``: the Starlette application (GET only, a strict Content-Security-Policy);
- ``cli``: the ``fsm inspect`` subcommand.
"""

from __future__ import annotations

__all__: list[str] = []
