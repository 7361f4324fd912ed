"""The feed's wake-ups ride the process's one ``LISTEN`` connection (``stores.sql.notify``),
shared with the workers' wake-ups: woken by a commit in another process, woken again after
the connection drops, and let go at ``close``."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import pytest
from conftest import SqlTarget
from test_work_notices import Woken

from stores.notices import channel
from stores.sql.feed import feed_channel
from stores.sql.notify import conninfo_of, listener_for


def _create_elsewhere(target: SqlTarget, entity_id: str) -> None:
    """A create and a start by another process (a history insert there: the trigger's NOTIFY)."""
    code = (
        "import sys; from fsm import Engine, PipelineLifecycle; from stores.sql import SqlStore; "
        "s = SqlStore(sys.argv[1], table_prefix=sys.argv[2], create=False); e = Engine(PipelineLifecycle, s); "
        "e.create(sys.argv[3]); e.fire(sys.argv[3], 'start'); s.close()"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", code, target.url, target.prefix, entity_id],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 0, done.stderr


def test_the_feed_and_the_workers_share_one_listener_that_reconnects(sql_target: SqlTarget) -> None:
    store = sql_target.store()
    if sql_target.dialect != "postgres":
        assert store.feed_wakeup(Woken()) is None  # type: ignore[attr-defined]  # SQLite: polled
        return
    store.enable_feed_notify()  # type: ignore[attr-defined]
    try:
        fed, work = Woken(), Woken()
        unsubscribe = store.feed_wakeup(fed)  # type: ignore[attr-defined]
        stop_work = store.subscribe_work("job", work)  # type: ignore[attr-defined]
        listener = listener_for(conninfo_of(store.engine))  # type: ignore[attr-defined]
        assert {feed_channel(sql_target.prefix), channel(sql_target.prefix, "job")} <= listener.subscribers.channels()
        assert not [t for t in threading.enumerate() if t.name == "fsm-feed-listener"]  # no listener of its own
        _create_elsewhere(sql_target, "p-1")
        assert fed.wait()  # a commit in another process woke the feed
        reconnects = listener.reconnects
        listener.drop_connection()
        assert fed.wait()  # after the reconnect every subscriber reads once: a notice may be lost
        for _ in range(100):  # the reconnect is counted once its LISTEN is done
            if listener.reconnects > reconnects:
                break
            threading.Event().wait(0.05)
        assert listener.reconnects > reconnects
        _create_elsewhere(sql_target, "p-2")
        assert fed.wait()  # and it listens again
        assert unsubscribe is not None
        store.close()  # this store's watchers are let go; the listener stays for the others
        assert feed_channel(sql_target.prefix) not in listener.subscribers.channels()
        assert channel(sql_target.prefix, "job") in listener.subscribers.channels()
        unsubscribe()  # after close: a no-op
        stop_work()
    finally:
        sql_target.store().disable_feed_notify()  # type: ignore[attr-defined]


@pytest.mark.parametrize("bad", [None, 3, "not callable"])
def test_a_feed_wakeup_that_is_not_callable_is_refused(sql_target: SqlTarget, bad: object) -> None:
    store = sql_target.store()
    if sql_target.dialect != "postgres":
        pytest.skip("SQLite's feed is polled: there is nothing to subscribe to")
    from fsm import InvalidArgument

    with pytest.raises(InvalidArgument):
        store.feed_wakeup(bad)  # type: ignore[attr-defined]
