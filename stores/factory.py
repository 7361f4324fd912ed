"""Open a store from a URL: what the CLI's ``--db`` takes.

``memory://`` is a fresh in-process store; any other URL is a SQLAlchemy URL
(``sqlite:///fsm.db``, ``postgresql+psycopg://user@host/db``) handed to ``SqlStore``.
"""

from __future__ import annotations

from fsm.clock import Clock
from fsm.errors import ConfigError
from stores.base import Store
from stores.memory import MemoryStore

DEFAULT_URL = "sqlite:///fsm.db"
"""The embedded default: a SQLite file in the working directory."""


def open_store(
    url: str = DEFAULT_URL, *, table_prefix: str = "fsm_", create: bool = True, clock: Clock | None = None
) -> Store:
    """A store for ``url``; SQL stores create their tables when missing (``create=True``).

    With ``create=False`` (readers such as ``fsm diagram --db``) nothing is created: a
    missing SQLite file or missing tables raise ``ConfigError``.  A URL SQLAlchemy cannot
    parse, or a database whose driver is not installed, raises ``ConfigError`` saying what
    to do; an unreachable database raises ``StoreUnavailable``.  ``clock`` replaces the
    store's own time (tests and simulations such as ``fsm demo``).
    """
    if not isinstance(url, str):
        raise ConfigError(f"a store URL is a string, not {type(url).__name__}")
    if url == "memory://":
        return MemoryStore(clock)
    from sqlalchemy.exc import ArgumentError

    from stores.sql import SqlStore  # imported on demand: the memory store needs no SQLAlchemy

    if not create and url.startswith("sqlite:///") and not url.endswith(":memory:"):
        import os

        path = url.removeprefix("sqlite:///")
        if not os.path.exists(path):
            raise ConfigError(f"no database file at {path!r} (nothing was created)")
    try:
        return SqlStore(url, table_prefix=table_prefix, create=create, clock=clock)
    except ModuleNotFoundError as err:
        hint = " (pip install 'fsm-lifecycles[postgres]')" if "psycopg" in str(err) else ""
        raise ConfigError(f"cannot open {safe_url(url)}: {err}{hint}") from err
    except ArgumentError as err:  # not a URL SQLAlchemy can parse
        raise ConfigError(f"cannot open {safe_url(url)}: {err}") from err


def safe_url(url: str) -> str:
    """``url`` with its password masked, for logs and banners."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url if "@" not in url else "<url hidden>"


__all__ = ["DEFAULT_URL", "open_store", "safe_url"]
