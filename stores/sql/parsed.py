"""psycopg cursors that parse each of the store's long statements once, not at every run.

psycopg turns a statement's ``%(name)s`` placeholders into ``$n`` on every execution, and
remembers the result only for statements up to 4,096 bytes (``MAX_CACHED_STATEMENT_LENGTH``:
a guard against the ever-different ``INSERT .. VALUES (..), (..)`` an ORM generates).  The
store's claim is one statement of about 8 kB (every claimable state, each priority part,
the lease and history writes), sent with the same text at every claim: psycopg parsed it
anew each time, measured at 0.3-0.5 ms of a worker's CPU per claim, more than the rest of
the claim's Python put together, and on the idle-pickup path of every job.

:class:`ParsedOnceCursor` keeps the parse of each long statement the store sends (their
texts are a small fixed set, so the memory is bounded by :data:`MAX_STATEMENTS`, beyond
which it parses as psycopg does).  Only the store's own connections use it: the caller's
connection in :meth:`SqlStore.joined` keeps its own cursors.  It relies on psycopg's
query helper (``PostgresQuery``, ``_query2pg_nocache``); :func:`cursor_factory` returns
``None`` (psycopg's own cursor) when the installed psycopg lacks either.
"""

from __future__ import annotations

import functools
from typing import Any

MAX_STATEMENTS = 256
"""How many long statements are kept parsed at most (the store sends a few dozen)."""

_PARSED: dict[tuple[str, str], Any] = {}


@functools.cache
def cursor_factory() -> type[Any] | None:
    """The cursor class for the store's psycopg connections, or ``None`` for psycopg's."""
    try:
        import psycopg
        from psycopg._queries import MAX_CACHED_STATEMENT_LENGTH, PostgresQuery, _query2pg_nocache
    except ImportError:  # pragma: no cover - another psycopg layout: its own cursor then
        return None
    if getattr(psycopg.Cursor, "_query_cls", None) is not PostgresQuery:  # pragma: no cover
        return None

    class _ParsedOnce(PostgresQuery):
        __slots__ = ()

        def convert(self, query: Any, vars: Any) -> None:
            if vars is None or type(query) is not str or len(query) <= MAX_CACHED_STATEMENT_LENGTH:
                super().convert(query, vars)
                return
            encoding = self._tx.encoding
            key = (query, encoding)
            parsed = _PARSED.get(key)
            if parsed is None:
                parsed = _query2pg_nocache(query.encode(encoding), encoding)
                if len(_PARSED) < MAX_STATEMENTS:
                    _PARSED[key] = parsed  # read only from here on, as psycopg's own cache is
            self.query, self._want_formats, self._order, self._parts = parsed
            self.dump(vars)

    class ParsedOnceCursor(psycopg.Cursor):
        """A psycopg cursor that parses a long statement's placeholders once."""

        __slots__ = ()
        _query_cls = _ParsedOnce

    return ParsedOnceCursor


__all__ = ["MAX_STATEMENTS", "cursor_factory"]
