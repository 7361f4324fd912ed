"""Operator actions (``--allow-actions``): a declared ``operator_override`` fired from the page,
behind the token and a CSRF token, refused when the entity changed, recorded naming the
operator; without the flag the page has no write route at all."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from inspect_support import artifacts_dir, chromium, http, post_action, serve_asgi, stop_serving  # noqa: F401 - fixtures

from fsm import Engine, JobLifecycle, Lifecycle, Policy, State, operator_override
from fsm.errors import ConfigError, Fenced, FsmError
from fsm.inspect.actions import csrf_token
from fsm.inspect.security import Tokens
from fsm.lifecycle import reaper, worker
from fsm.records import LeaseChange
from stores.sql import SqlStore

TOKEN = "an-operators-bearer-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


class OpsJob(Lifecycle):
    """A job with two operator overrides: cancel (queued or running) and release (a finalizer's lease)."""

    kind = "opsjob"
    policy = Policy(
        lease_ttl=timedelta(minutes=2),
        renewal_budget={"running": timedelta(hours=1), "finalizing": timedelta(hours=1)},
        max_attempts=3,
        max_reclaims=2,
    )
    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    completed = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active), lease=LeaseChange.ACQUIRE, counts_attempt=True)
    exited = worker(active.running.to(active.finalizing, cond="holds_lease"))
    complete = worker(active.finalizing.to(completed, cond="holds_lease"))
    expire = reaper(active.running.to(failed, cond="lease_stale"), reason="expired") | reaper(
        active.finalizing.to(failed, cond="lease_stale"), reason="expired"
    )
    cancel = operator_override(queued.to(failed) | active.running.to(failed), reason="cancelled")
    release = operator_override(
        active.finalizing.to.itself(),  # type: ignore[no-untyped-call]
        lease=LeaseChange.CLEAR,
        reason="released",
    )


@pytest.fixture(name="ops", scope="module")
def ops_served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fsm.inspect.app import create_app

    url = f"sqlite:///{tmp_path_factory.mktemp('ops')}/fsm.db"
    store = SqlStore(url, table_prefix="fsm_")
    engine = Engine(OpsJob, store, owner="worker-1")
    server, thread, base = serve_asgi(
        create_app(store, [OpsJob, JobLifecycle], tokens=Tokens(TOKEN), allow_actions=True, count_every=0.1)
    )
    yield base, engine, store
    stop_serving(server, thread)
    store.close()


def post(base: str, form: dict[str, str], headers: dict[str, str] | None = None) -> Any:
    return post_action(base, form, TOKEN, headers)


def form_for(engine: Engine, entity_id: str, event: str, **changes: str) -> dict[str, str]:
    snap = engine.get(entity_id)
    found = {
        "id": entity_id,
        "event": event,
        "version": str(snap.version),
        "csrf": csrf_token(TOKEN, "bearer"),
        "operator": "alice",
        "note": "stuck since the deploy",
    }
    found.update(changes)
    return found


def test_without_the_flag_there_is_no_write_route(tmp_path: Path) -> None:
    from fsm.inspect.app import create_app

    store = SqlStore(f"sqlite:///{tmp_path}/fsm.db", table_prefix="fsm_")
    Engine(OpsJob, store).create("o-1")
    server, thread, base = serve_asgi(create_app(store, [OpsJob], tokens=Tokens(TOKEN)))
    try:
        assert "<form class=action" not in http(base + "/entity?id=o-1", headers=BEARER).body
        assert post(base, {"id": "o-1", "event": "cancel"}).status in {404, 405}
        assert Engine(OpsJob, store).get("o-1").state == "queued"
    finally:
        stop_serving(server, thread)
        store.close()
    with pytest.raises(ConfigError):
        create_app(store, [OpsJob], allow_actions=True)  # actions need the token


def test_a_declared_cancel_is_fired_and_recorded_naming_the_operator(ops: Any) -> None:
    base, engine, _ = ops
    engine.create("o-cancel")
    page = http(base + "/entity?id=o-cancel", headers=BEARER).body
    assert "data-event='cancel'" in page and "data-event='release'" not in page  # only what is declared here
    answer = post(base, form_for(engine, "o-cancel", "cancel"))
    assert answer.status == 303 and answer.headers["Location"] == "/entity?id=o-cancel"
    snap = engine.get("o-cancel")
    assert snap.state == "failed"
    last = engine.history("o-cancel")[-1]
    assert (last.event, last.source, last.target) == ("cancel", "queued", "failed")
    assert last.reason == "operator alice: stuck since the deploy"
    assert "operator alice" in http(base + "/entity?id=o-cancel", headers=BEARER).body


def test_a_running_entity_is_cancelled_and_its_holder_fenced(ops: Any) -> None:
    base, engine, _ = ops
    engine.create("o-run")
    [held] = engine.claim(1)
    assert held.id == "o-run" and held.lease is not None
    assert post(base, form_for(engine, "o-run", "cancel", note="")).status == 303
    last = engine.history("o-run")[-1]
    assert last.reason == "operator alice" and engine.get("o-run").state == "failed"
    with pytest.raises(FsmError):  # the holder's late write is refused: the entity left running
        engine.fire("o-run", "exited", lease=held.lease)


def test_releasing_a_finalizers_lease_fences_its_holder(ops: Any) -> None:
    base, engine, _ = ops
    engine.create("o-fin")
    [held] = engine.claim(1)
    assert held.lease is not None
    engine.fire("o-fin", "exited", lease=held.lease)
    assert "release the lease" in http(base + "/entity?id=o-fin", headers=BEARER).body
    assert post(base, form_for(engine, "o-fin", "release", operator="bob")).status == 303
    snap = engine.get("o-fin")
    assert snap.state == "finalizing" and snap.lease_owner is None
    assert engine.history("o-fin")[-1].reason == "operator bob: stuck since the deploy"
    with pytest.raises(Fenced):
        engine.fire("o-fin", "complete", lease=held.lease)
    assert engine.get("o-fin").state == "finalizing"


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ({"csrf": ""}, 403, "CSRF"),
        ({"csrf": csrf_token(TOKEN, "someone-else")}, 403, "CSRF"),
        ({"version": "0"}, 409, "changed since the page was shown"),
        ({"event": "start"}, 400, "not an operator override"),
        ({"event": "release"}, 400, "not an operator override"),  # declared, but not out of queued
        ({"operator": ""}, 400, "say who you are"),
        ({"operator": "a\x00b"}, 400, "NUL"),
        ({"id": "no-such"}, 404, "no entity"),
        ({"version": "x"}, 400, "version"),
    ],
)
def test_a_bad_action_is_refused_and_changes_nothing(ops: Any, change: dict[str, str], status: int, says: str) -> None:
    base, engine, _ = ops
    entity_id = f"o-bad-{abs(hash(str(change))) % 10**8}"
    engine.create(entity_id)
    form = {**form_for(engine, entity_id, "cancel"), **change}
    if change.get("version") == "0":
        form["version"] = str(engine.get(entity_id).version + 1)
    answer = post(base, form)
    assert answer.status == status and says in answer.body, answer.body[:300]
    assert engine.get(entity_id).state == "queued" and engine.history(entity_id) == []


def test_another_sites_form_and_a_missing_token_are_refused(ops: Any) -> None:
    base, engine, _ = ops
    engine.create("o-origin")
    form = form_for(engine, "o-origin", "cancel")
    assert post(base, form, {"Origin": "http://evil.example"}).status == 403
    assert post(base, form, {"Authorization": ""}).status == 401
    assert post(base, form, {"Content-Type": "text/plain"}).status == 415
    assert engine.get("o-origin").state == "queued"
    port = base.rsplit(":", 1)[1]
    assert post(base, form, {"Origin": f"http://127.0.0.1:{port}"}).status == 303


@pytest.mark.browser
def test_an_operator_cancels_from_the_page_after_signing_in(browser: Any, ops: Any, artifacts: Path) -> None:
    from selenium.webdriver.common.by import By

    base, engine, store = ops
    engine.create("o-browser")
    tokens = Tokens(TOKEN)  # the page's tokens: a fresh one-time code through the same secret
    from fsm.inspect.app import create_app

    server, thread, guarded = serve_asgi(create_app(store, [OpsJob], tokens=tokens, allow_actions=True))
    try:
        browser.get(f"{guarded}/login?code={tokens.new_code()}")
        browser.get(guarded + "/entity?id=o-browser")
        assert browser.find_element(By.CSS_SELECTOR, "header .ro").text == "operator actions on"
        form = browser.find_element(By.CSS_SELECTOR, "form.action[data-event='cancel']")
        form.find_element(By.NAME, "operator").send_keys("carol")
        form.find_element(By.NAME, "note").send_keys("duplicate of o-1")
        browser.save_screenshot(str(artifacts / "action-form.png"))
        form.find_element(By.TAG_NAME, "button").click()
        from selenium.common.exceptions import StaleElementReferenceException

        for _ in range(100):
            try:
                if "operator carol" in browser.find_element(By.TAG_NAME, "body").text:
                    break
            except StaleElementReferenceException:  # the page was replaced as we read it: read again
                pass
            import time

            time.sleep(0.05)
        assert engine.get("o-browser").state == "failed", (browser.current_url, browser.page_source[:1500])
        assert engine.history("o-browser")[-1].reason == "operator carol: duplicate of o-1"
        assert "cancel: queued → failed" in browser.find_element(By.CSS_SELECTOR, "ol.timeline").text
    finally:
        stop_serving(server, thread)


def test_allow_actions_asks_for_the_token_even_on_loopback(monkeypatch: pytest.MonkeyPatch) -> None:
    from fsm.cli import build_parser
    from fsm.inspect.cli import TOKEN_ENV, announce, tokens_for

    monkeypatch.delenv(TOKEN_ENV, raising=False)
    args = build_parser().parse_args(["inspect", "--db", "sqlite:///x.db", "--allow-actions"])
    tokens = tokens_for(args)
    assert tokens is not None
    said = "\n".join(announce(args, tokens))
    assert "operator actions allowed" in said and "/login?code=" in said
    plain = build_parser().parse_args(["inspect", "--db", "sqlite:///x.db"])
    assert tokens_for(plain) is None and "read-only" in announce(plain, None)[0]


def test_the_built_in_job_offers_cancel_and_release_but_never_cancels_a_finalizer(ops: Any) -> None:
    base, _, store = ops
    jobs = Engine(JobLifecycle, store, owner="worker-2")

    def offered(entity_id: str) -> set[str]:
        page = http(base + "/entity?id=" + entity_id, headers=BEARER).body
        return {e for e in ("cancel", "release", "resubmit", "retry-as-new") if f"data-event='{e}'" in page}

    jobs.create("b-queued")
    assert offered("b-queued") == {"cancel"}  # resubmit records a retry's creation: never a button
    queued_page = http(base + "/entity?id=b-queued", headers=BEARER).body
    assert "cancel (to failed)</button>" in queued_page and "release the lease" not in queued_page
    jobs.create("b-run")
    [held] = [s for s in jobs.claim(5) if s.id == "b-run"]
    assert held.lease is not None and offered("b-run") == {"cancel", "release"}
    assert "release the lease (back to queued)" in http(base + "/entity?id=b-run", headers=BEARER).body
    form = {**form_for(jobs, "b-run", "release"), "csrf": csrf_token(TOKEN, "bearer")}
    assert post(base, form).status == 303
    requeued = jobs.get("b-run")
    assert requeued.state == "queued" and requeued.lease_owner is None
    assert jobs.history("b-run")[-1].reason == "operator alice: stuck since the deploy"
    with pytest.raises(FsmError):  # the released holder is fenced
        jobs.fire("b-run", "exited", lease=held.lease)
    [again] = [s for s in jobs.claim(5) if s.id == "b-run"]
    assert again.lease is not None and again.lease.token > held.lease.token
    jobs.fire("b-run", "exited", lease=again.lease)
    assert offered("b-run") == {"release"}  # a live finalizer: release it, never cancel it
    refused = post(base, form_for(jobs, "b-run", "cancel"))
    assert refused.status == 400 and "not an operator override" in refused.body
    assert jobs.get("b-run").state == "finalizing"
    with pytest.raises(FsmError):
        jobs.fire("b-run", "cancel")


def test_cancelling_a_running_pipeline_fails_its_running_steps() -> None:
    from fsm import PipelineLifecycle
    from stores import MemoryStore

    pipes = Engine(PipelineLifecycle, MemoryStore())
    steps = [{"name": "build", "status": "completed"}, {"name": "deploy", "status": "running"}]
    pipes.create("p", data={"steps": steps})
    pipes.fire("p", "start")
    done = pipes.fire("p", "cancel", reason="operator alice").snapshot
    assert done.state == "failed" and [s["status"] for s in done.data["steps"]] == ["completed", "failed"]
    pipes.create("p2")
    pipes.fire("p2", "start")
    pipes.fire("p2", "finish")
    with pytest.raises(FsmError):  # a pipeline's finalizer may be deploying: no cancel declared
        pipes.fire("p2", "cancel")
