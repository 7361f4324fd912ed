"""Retry a failed entity as a new one (fsm.inspect.retry): the failed entity is never moved
(I5); the new one's first transition is the lifecycle's resubmit, naming the operator and
the original; each page links to the other; the page's action is CSRF- and version-checked."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm import Engine, JobLifecycle, Lifecycle, PipelineLifecycle, State, operator_override, worker
from fsm.errors import EntityExists, FsmError, InvalidArgument, StaleVersion, TransitionNotAllowed
from fsm.inspect import retry
from fsm.records import Snapshot
from stores import Store

TOKEN = "an-operators-bearer-token-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def failed_job(engine: Engine, entity_id: str, data: dict[str, Any] | None = None) -> Snapshot:
    engine.create(entity_id, data=data or {"task": "deploy"}, concurrency_key="main")
    [held] = engine.claim(1)
    assert held.id == entity_id and held.lease is not None
    engine.fire(entity_id, "exited", lease=held.lease, data={"exit_code": 3})
    return engine.fire(entity_id, "fail", lease=held.lease, reason="gate failed").snapshot


def cancelled_job(engine: Engine, entity_id: str) -> Snapshot:
    """A failed job without a claim (the served store is shared: a claim could take another's)."""
    engine.create(entity_id, data={"task": "deploy"})
    return engine.fire(entity_id, "cancel", reason="operator dave").snapshot


def frozen(engine: Engine, entity_id: str) -> tuple[Snapshot, list[Any]]:
    return engine.store.get(entity_id, include_deleted=True), engine.store.history(entity_id)


# -- the store API: memory, SQLite, PostgreSQL -------------------------------------------------


def test_a_retry_is_a_new_entity_whose_creation_names_the_operator_and_the_original(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="worker-1")
    failed = failed_job(jobs, "job-7", {"task": "deploy", "exit_code": 3})
    before = frozen(jobs, "job-7")
    made = retry.retry_failed(jobs, "job-7", operator="alice", note="flaky gate", version=failed.version)
    assert made.id == "job-7~retry1" and made.state == "queued" and made.version == 1
    assert made.data == failed.data and made.concurrency_key == "main" and made.attempt == 0
    [first] = jobs.history(made.id)
    assert (first.event, first.source, first.target, first.seq) == ("resubmit", "queued", "queued", 1)
    assert first.reason == "operator alice: retry of job-7: flaky gate"
    assert frozen(jobs, "job-7") == before  # the failed entity is unchanged: final is absorbing (I5)
    assert retry.links(jobs.get(made.id), jobs.history(made.id), JobLifecycle, jobs.history) == ("job-7", None)
    assert retry.links(failed, before[1], JobLifecycle, jobs.history) == (None, "job-7~retry1")
    [claimed] = jobs.claim(1)  # the retry is ordinary work: a worker claims and starts it
    assert claimed.id == made.id and claimed.state == "running" and claimed.attempt == 1


def test_a_failed_entity_is_retried_once_and_a_retry_of_the_retry_counts_on(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="worker-1")
    failed_job(jobs, "job-8")
    retry.retry_failed(jobs, "job-8", operator="alice")
    with pytest.raises(EntityExists):  # a double submit, or a second operator: refused by the create
        retry.retry_failed(jobs, "job-8", operator="bob")
    assert [h.reason for h in jobs.history("job-8~retry1")] == ["operator alice: retry of job-8"]
    [held] = jobs.claim(1)
    assert held.lease is not None
    jobs.fire(held.id, "fail", lease=held.lease)
    again = retry.retry_failed(jobs, "job-8~retry1", operator="bob")
    assert again.id == "job-8~retry2"
    assert jobs.history(again.id)[0].reason == "operator bob: retry of job-8~retry1"
    page = retry.links(jobs.get("job-8~retry1"), jobs.history("job-8~retry1"), JobLifecycle, jobs.history)
    assert page == ("job-8", "job-8~retry2")


@pytest.mark.parametrize("how", ["queued", "running", "completed", "finalizing"])
def test_only_a_failed_entity_is_retried_and_a_refusal_creates_nothing(any_store: Store, how: str) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="worker-1")
    jobs.create("j")
    if how != "queued":
        [held] = jobs.claim(1)
        assert held.lease is not None
        if how in {"completed", "finalizing"}:
            jobs.fire("j", "exited", lease=held.lease)
        if how == "completed":
            jobs.fire("j", "complete", lease=held.lease)
    before = frozen(jobs, "j")
    with pytest.raises(TransitionNotAllowed):
        retry.retry_failed(jobs, "j", operator="alice")
    assert frozen(jobs, "j") == before
    with pytest.raises(FsmError):
        jobs.get("j~retry1")


def test_a_retry_from_a_stale_page_and_of_a_too_long_id_are_refused(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="worker-1")
    failed = failed_job(jobs, "job-9")
    with pytest.raises(StaleVersion):
        retry.retry_failed(jobs, "job-9", operator="alice", version=failed.version - 1)
    long_id = "x" * 250
    failed_job(jobs, long_id)
    with pytest.raises(InvalidArgument, match="too long"):
        retry.retry_failed(jobs, long_id, operator="alice")
    with pytest.raises(FsmError):
        jobs.get("job-9~retry1")


def test_a_retried_pipeline_starts_with_its_steps_queued_again(any_store: Store) -> None:
    pipes = Engine(PipelineLifecycle, any_store, owner="ci")
    steps = [{"name": "build", "status": "completed"}, {"name": "test", "status": "running"}]
    pipes.create("p-1", data={"steps": steps, "commit": "9f2c1e"})
    pipes.fire("p-1", "start")
    cancelled = pipes.fire("p-1", "cancel", reason="operator alice").snapshot
    assert cancelled.state == "failed" and [s["status"] for s in cancelled.data["steps"]] == ["completed", "failed"]
    made = retry.retry_failed(pipes, "p-1", operator="alice")
    assert [s["status"] for s in made.data["steps"]] == ["queued", "queued"] and made.data["commit"] == "9f2c1e"
    assert [s["status"] for s in pipes.get("p-1").data["steps"]] == ["completed", "failed"]


def test_a_user_entity_named_like_a_retry_is_not_shown_as_one(any_store: Store) -> None:
    jobs = Engine(JobLifecycle, any_store, owner="worker-1")
    failed = failed_job(jobs, "build")
    jobs.create("build~retry1")  # the application's own entity, not a retry
    assert retry.links(failed, jobs.history("build"), JobLifecycle, jobs.history) == (None, None)
    assert retry.links(jobs.get("build~retry1"), [], JobLifecycle, jobs.history) == (None, None)
    with pytest.raises(EntityExists):
        retry.retry_failed(jobs, "build", operator="alice")


def test_a_lifecycle_without_a_resubmit_offers_no_retry(any_store: Store) -> None:
    class Plain(Lifecycle):
        kind = "plain"
        queued = State(initial=True)

        class active(State.Compound):
            running = State(initial=True)
            finalizing = State()

        completed = State(final=True)
        failed = State(final=True)
        start = worker(queued.to(active))
        finish = worker(active.running.to(active.finalizing))
        succeed = worker(active.finalizing.to(completed, cond="holds_lease"))
        give_up = operator_override(queued.to(failed))

    assert retry.resubmit_event(Plain) is None and retry.retryable_states(Plain) == frozenset({"failed"})
    engine = Engine(Plain, any_store)
    engine.create("p")
    engine.fire("p", "give_up")
    with pytest.raises(TransitionNotAllowed, match="declares no resubmit"):
        retry.retry_failed(engine, "p", operator="alice")
    assert retry.resubmit_event(JobLifecycle) == "resubmit"
    assert retry.retryable_states(JobLifecycle) == frozenset({"failed"})


def test_on_sql_the_create_and_the_resubmit_commit_together(sql_target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    store = sql_target.store()
    jobs = Engine(JobLifecycle, store, owner="worker-1")
    failed_job(jobs, "job-atomic")
    original = Engine.fire

    def fire(self: Engine, entity: Any, event: str, **kwargs: Any) -> Any:
        if event == "resubmit":
            raise RuntimeError("the process dies between the create and its first transition")
        return original(self, entity, event, **kwargs)

    monkeypatch.setattr(Engine, "fire", fire)
    with pytest.raises(RuntimeError):
        retry.retry_failed(jobs, "job-atomic", operator="alice")
    monkeypatch.setattr(Engine, "fire", original)
    with pytest.raises(FsmError):  # rolled back with it: no retry without its recorded creation
        jobs.get("job-atomic~retry1")
    assert retry.retry_failed(jobs, "job-atomic", operator="alice").version == 1


def test_the_derived_ids() -> None:
    assert retry.retry_id("a") == "a~retry1" and retry.retry_id("a~retry1") == "a~retry2"
    assert retry.retry_id("a~retry9") == "a~retry10" and retry.retry_id("a~retry0") == "a~retry0~retry1"
    assert retry.retried_id("a~retry1") == "a" and retry.retried_id("a~retry10") == "a~retry9"
    assert retry.retried_id("a") is None and retry.retried_id("~retry1") is None


# -- the page: HTTP and a browser -----------------------------------------------------------

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

from inspect_support import artifacts_dir, chromium, http, post_action, serve_asgi, stop_serving  # noqa: E402, F401 - fixtures

from fsm.inspect.actions import RETRY, csrf_token  # noqa: E402
from fsm.inspect.security import Tokens  # noqa: E402


@pytest.fixture(name="site", params=["sqlite", "postgres"], scope="module")
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    import uuid

    from conftest import postgres_url

    from fsm.inspect.app import create_app
    from stores.sql import SqlStore
    from stores.sql.migrate import drop_schema

    if request.param == "sqlite":
        url, prefix = f"sqlite:///{tmp_path_factory.mktemp('retry')}/fsm.db", "fsm_"
    else:
        url, prefix = postgres_url(), f"t{uuid.uuid4().hex[:10]}_"
    store = SqlStore(url, table_prefix=prefix)
    jobs = Engine(JobLifecycle, store, owner="worker-1")
    app = create_app(store, [JobLifecycle, PipelineLifecycle], tokens=Tokens(TOKEN), allow_actions=True)
    server, thread, base = serve_asgi(app)
    try:
        yield base, jobs, store
    finally:
        stop_serving(server, thread)
        if request.param == "postgres":
            drop_schema(store.engine, table_prefix=prefix)
        store.close()


def post(base: str, form: dict[str, str], headers: dict[str, str] | None = None) -> Any:
    return post_action(base, form, TOKEN, headers)


def retry_form(jobs: Engine, entity_id: str, **changes: str) -> dict[str, str]:
    form = {
        "id": entity_id,
        "event": RETRY,
        "version": str(jobs.get(entity_id).version),
        "csrf": csrf_token(TOKEN, "bearer"),
        "operator": "alice",
        "note": "",
    }
    form.update(changes)
    return form


def test_the_failed_page_offers_a_retry_that_opens_the_new_entity_linked_both_ways(site: Any) -> None:
    base, jobs, _ = site
    cancelled_job(jobs, "web-1")
    before = frozen(jobs, "web-1")
    page = http(base + "/entity?id=web-1", headers=BEARER).body
    assert f"data-event='{RETRY}'" in page and "retry as a new entity (web-1~retry1)" in page
    answer = post(base, retry_form(jobs, "web-1", note="gate was flaky"))
    assert answer.status == 303 and answer.headers["Location"] == "/entity?id=web-1~retry1"
    assert frozen(jobs, "web-1") == before
    assert jobs.history("web-1~retry1")[0].reason == "operator alice: retry of web-1: gate was flaky"
    new_page = http(base + "/entity?id=web-1~retry1", headers=BEARER).body
    assert "retry of <a class=retry-of href='/entity?id=web-1'>web-1</a>" in new_page
    assert "operator alice: retry of web-1" in new_page and f"data-event='{RETRY}'" not in new_page
    assert "data-event='resubmit'" not in new_page  # the resubmit only records a creation
    old_page = http(base + "/entity?id=web-1", headers=BEARER).body
    assert "retried as <a class=retried-as href='/entity?id=web-1~retry1'>web-1~retry1</a>" in old_page


@pytest.mark.parametrize(
    ("change", "status", "says"),
    [
        ({"csrf": ""}, 403, "CSRF"),
        ({"version": "0"}, 409, "changed since the page was shown"),
        ({"operator": ""}, 400, "say who you are"),
        ({"operator": "a\x00b"}, 400, "NUL"),
    ],
)
def test_a_bad_retry_is_refused_and_creates_nothing(site: Any, change: dict[str, str], status: int, says: str) -> None:
    base, jobs, _ = site
    entity_id = f"web-bad-{abs(hash(str(change))) % 10**8}"
    cancelled_job(jobs, entity_id)
    before = frozen(jobs, entity_id)
    answer = post(base, retry_form(jobs, entity_id, **change))
    assert answer.status == status and says in answer.body, answer.body[:300]
    assert frozen(jobs, entity_id) == before
    with pytest.raises(FsmError):
        jobs.get(entity_id + "~retry1")


def test_a_second_retry_and_a_retry_of_live_work_are_refused(site: Any) -> None:
    base, jobs, _ = site
    cancelled_job(jobs, "web-twice")
    assert post(base, retry_form(jobs, "web-twice")).status == 303
    again = post(base, retry_form(jobs, "web-twice", operator="bob"))
    assert again.status == 409 and "retried already, as web-twice~retry1" in again.body
    assert [h.reason for h in jobs.history("web-twice~retry1")] == ["operator alice: retry of web-twice"]
    jobs.create("web-queued")
    answer = post(base, retry_form(jobs, "web-queued"))
    assert answer.status == 400 and "not an operator override" in answer.body
    assert jobs.history("web-queued") == []
    queued_page = http(base + "/entity?id=web-queued", headers=BEARER).body
    assert "data-event='cancel'" in queued_page and "data-event='resubmit'" not in queued_page


@pytest.mark.browser
def test_an_operator_retries_a_failed_job_from_the_page(browser: Any, site: Any, artifacts: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    from fsm.inspect.app import create_app

    base, jobs, store = site
    cancelled_job(jobs, "web-browser")
    tokens = Tokens(TOKEN)
    server, thread, guarded = serve_asgi(create_app(store, [JobLifecycle], tokens=tokens, allow_actions=True))
    try:
        browser.get(f"{guarded}/login?code={tokens.new_code()}")
        browser.get(guarded + "/entity?id=web-browser")
        form = browser.find_element(By.CSS_SELECTOR, f"form.action[data-event='{RETRY}']")
        form.find_element(By.NAME, "operator").send_keys("carol")
        form.find_element(By.TAG_NAME, "button").click()
        for _ in range(200):
            try:
                if browser.find_elements(By.CSS_SELECTOR, "a.retry-of"):
                    break
            except StaleElementReferenceException:  # the page was replaced as we read it
                pass
            time.sleep(0.05)
        link = browser.find_element(By.CSS_SELECTOR, "a.retry-of")
        assert link.text == "web-browser"
        assert browser.find_element(By.CSS_SELECTOR, "h1.id").text == "web-browser~retry1"
        browser.save_screenshot(str(artifacts / "retried.png"))
        assert jobs.get("web-browser").state == "failed"
        assert jobs.history("web-browser~retry1")[0].reason == "operator carol: retry of web-browser"
        link.click()
        for _ in range(200):
            if browser.find_elements(By.CSS_SELECTOR, "a.retried-as"):
                break
            time.sleep(0.05)
        assert browser.find_element(By.CSS_SELECTOR, "a.retried-as").text == "web-browser~retry1"
    finally:
        stop_serving(server, thread)
