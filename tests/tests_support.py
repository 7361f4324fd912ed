"""Small lifecycles shared by tests."""

from __future__ import annotations

from statemachine import State

from fsm import Lifecycle, reaper, worker


class Untyped(Lifecycle):
    """A lifecycle with no data model."""

    queued = State(initial=True)

    class active(State.Compound):
        running = State(initial=True)
        finalizing = State()

    done = State(final=True)
    failed = State(final=True)

    start = worker(queued.to(active))
    finish = worker(active.running.to(active.finalizing))
    succeed = worker(active.finalizing.to(done, cond="holds_lease"))
    expire = reaper(active.to(failed, cond="lease_stale"), reason="expired")


def readme_lifecycle(heading: str = "## Declaring your own lifecycle") -> type[Lifecycle]:
    """The lifecycle class the README declares under ``heading``, exec'd as written."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    match = re.search(r"```python\n(.*?)```", text[text.index(heading) :], re.S)
    assert match is not None, f"no python block after {heading!r}"
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(match.group(1), namespace)
    found = [v for v in namespace.values() if isinstance(v, type) and issubclass(v, Lifecycle) and v is not Lifecycle]
    assert len(found) == 1, found
    return found[0]


README_GUARD_DATA = {"tests_green": ({"tests_passed": True}, {"tests_passed": False})}
