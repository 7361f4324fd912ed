"""Small lifecycles shared by tests."""

from __future__ import annotations

from pathlib import Path

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


def readme_lifecycle(heading: str = "# Declare your own lifecycle") -> type[Lifecycle]:
    """The lifecycle class the guide declares under ``heading``, exec'd as written."""
    namespace: dict[str, object] = {"__name__": "readme_example"}
    exec(guide_block_after(heading), namespace)
    found = [v for v in namespace.values() if isinstance(v, type) and issubclass(v, Lifecycle) and v is not Lifecycle]
    assert len(found) == 1, found
    return found[0]


README_GUARD_DATA = {"tests_green": ({"tests_passed": True}, {"tests_passed": False})}


def guide_files() -> list[Path]:
    """The README and the documentation site's pages (not the tutorial: its blocks are
    the steps of one example file)."""
    root = Path(__file__).resolve().parents[1]
    pages = sorted(p for p in (root / "docs" / "pages").rglob("*.md") if p.name != "tutorial.md")
    return [root / "README.md", *pages]


def guide_text() -> str:
    """Everything a user reads: the README and every page of the site."""
    return "\n".join(path.read_text() for path in guide_files())


def guide_block_after(marker: str) -> str:
    """The first Python block after ``marker`` in the README or the page that holds it."""
    import re

    for path in guide_files():
        text = path.read_text()
        if marker in text:
            match = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S)
            assert match is not None, f"no python block after {marker!r} in {path.name}"
            return match.group(1)
    raise AssertionError(f"{marker!r} is in neither the README nor a page of the site")
