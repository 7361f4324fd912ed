"""The packages import one way, bottom to top (DESIGN section 2), so each layer reads alone.

Test folders mirror the packages with a ``test_`` prefix (``tests/test_stores/sql`` for
``stores/sql``): a folder named ``tests/stores`` would shadow the real package on the path.

1. the data model: records, clock, errors, policy;
2. ``stores`` and ``signals``;
3. the lifecycle declaration and its compiled table (guards, guard expressions, table, the
   refusals of unsupported python-statemachine features, lifecycle, built-ins);
4. the engine;
5. the reaper, the durable work and the diagram export;
6. the command lines and ``fsm.testing``.

Every import is checked, module level and inside functions alike: a lazy import upward is
still a knot in the layers.  ``fsm/__init__.py`` is the package's face and re-exports
from every layer lazily, so it is the one exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS: list[tuple[int, tuple[str, ...]]] = [
    (
        6,
        (
            "fsm.cli",
            "fsm.__main__",
            "fsm.commands",
            "fsm.demo",
            "fsm.testing",
            "fsm.reaping.cli",
            "fsm.reaping.prune_cli",
            "fsm.scheduling.cli",
            "fsm.diagram.cli",
            "fsm.evolution.cli",
            "fsm.inspect",
        ),
    ),
    (5, ("fsm.reaping", "fsm.scheduling", "fsm.work", "fsm.diagram", "fsm.aio", "fsm.observe", "fsm.evolution")),
    (4, ("fsm.engine",)),
    (
        3,
        (
            "fsm.guards",
            "fsm.timers",
            "fsm.builders",
            "fsm.guard_expr",
            "fsm.table",
            "fsm.chains",
            "fsm.history",
            "fsm.regions",
            "fsm.unsupported",
            "fsm.definition_rules",
            "fsm.lifecycle",
            "fsm.lifecycles",
            "fsm.evolution.declare",
        ),
    ),
    (2, ("stores", "signals")),
    (
        1,
        (
            "fsm.records",
            "fsm.id_write",
            "fsm.clock",
            "fsm.errors",
            "fsm.policy",
            "fsm.limits",
            "fsm.coordination",
            "fsm.ids",
            "fsm._version",
        ),
    ),
]


ALLOWED_UPWARD: set[tuple[str, str]] = set()  # none: the keeper is fsm.work's to build


def layer_of(module: str) -> int | None:
    """The layer of the longest prefix that names ``module`` (most specific first:
    fsm.reaping.cli before fsm.reaping, fsm.evolution.declare before fsm.evolution)."""
    found = [
        (len(p), number) for number, prefixes in LAYERS for p in prefixes if module == p or module.startswith(p + ".")
    ]
    return max(found)[1] if found else None


def _modules() -> list[tuple[str, Path]]:
    found = []
    for package in ("fsm", "stores", "signals"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found.append((".".join(parts), path))
    return found


def _imports(path: Path, module: str) -> list[str]:
    names = []
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names.append(".".join([*base, node.module] if node.module else base))
            elif node.module:
                names.append(node.module)
    return names


def test_every_module_of_ours_has_a_layer() -> None:
    unplaced = [m for m, _ in _modules() if m != "fsm" and layer_of(m) is None]
    assert not unplaced, f"place these modules in a layer: {unplaced}"


@pytest.mark.parametrize(("module", "path"), [m for m in _modules() if m[0] != "fsm"], ids=str)
def test_imports_run_one_way(module: str, path: Path) -> None:
    own = layer_of(module)
    assert own is not None
    upward = []
    for name in _imports(path, module):
        target = layer_of(name)
        if target is not None and target > own and (module, name) not in ALLOWED_UPWARD:
            upward.append(f"{name} (layer {target})")
    assert not upward, f"{module} (layer {own}) imports upward: {upward}"


def test_the_checker_catches_an_upward_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from fsm.engine import Engine\n")
    assert "fsm.engine" in _imports(bad, "stores.bad")
    assert layer_of("fsm.engine.judge") == 4 > layer_of("stores.bad") == 2  # type: ignore[operator]
