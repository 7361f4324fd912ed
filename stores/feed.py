"""The feed's arguments and positions, shared by every store (``Store.feed``).

A position is an opaque string whose first letter names the store family that made it:
``m<n>`` (memory: the n-th committed history row), ``s<rowid>`` (SQLite: the history row's
rowid; one writer at a time, so rowid order is commit order), ``p<txid>.<seq>.<entity id>``
(PostgreSQL: the writing transaction's id, then the row's key, the id percent-encoded; see
:mod:`stores.sql.feed`).  Every position is printable ASCII: an SSE ``id`` or a URL as it is.
"""

from __future__ import annotations

from fsm.errors import InvalidArgument
from fsm.limits import check_id

MAX_FEED_LIMIT = 10_000
MAX_POSITION = 2400
"""Longest position accepted: a PostgreSQL one holds an entity id (255 characters at most,
percent-encoded: positions are ASCII without control characters, safe as an SSE ``id``)."""


def feed_args(after: object, kind: object, limit: object, family: str) -> str | None:
    """Check ``feed``'s arguments; return the body of ``after`` (without its family letter)."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_FEED_LIMIT:
        raise InvalidArgument(f"limit must be an integer from 1 to {MAX_FEED_LIMIT}, not {limit!r}")
    if kind is not None:
        check_id("kind", kind)
    if after is None:
        return None
    if not isinstance(after, str):
        raise InvalidArgument(f"a feed position is a string, not {type(after).__name__}")
    if len(after) > MAX_POSITION or not after.startswith(family) or "\x00" in after:
        raise InvalidArgument(f"{after[:80]!r} is not a feed position of this store")
    try:
        after.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument("a feed position holds no surrogate characters") from None
    return after[len(family) :]


def counter(body: str | None, family: str) -> int:
    """The integer of an ``m<n>`` or ``s<n>`` position (0 for none)."""
    if body is None:
        return 0
    if not body.isascii() or not body.isdigit() or len(body) > 19:
        raise InvalidArgument(f"{family + body!r} is not a feed position of this store")
    return int(body)


__all__ = ["MAX_FEED_LIMIT", "counter", "feed_args"]
