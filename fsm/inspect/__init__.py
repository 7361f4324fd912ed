"""``fsm inspect``: a live web page of a store (the ``inspect`` extra), read-only unless
``--allow-actions``.

- ``data``: the reads (bound parameters only), over ``listing`` (the entity table's index
  walks and keyset pages), ``activity`` (the charts' bounded sample, the holders) and
  ``cache`` (values recomputed off the request path, their age shown);
- ``pages``, ``views``, ``charts``, ``timeline``: the HTML and inline SVG, every database
  value escaped;
- ``security``: the Host allowlist, the token, the headers on every answer;
- ``actions``: the opt-in operator actions (declared ``operator_override`` transitions);
- ``app``: the Starlette application; ``cli``: the ``fsm inspect`` subcommand.
"""

from __future__ import annotations

__all__: list[str] = []
