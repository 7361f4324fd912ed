"""Naming a lifecycle as ``module:Class``, the way the CLI and exported files do."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from fsm.errors import FsmError
from fsm.lifecycle import Lifecycle

BUILTINS: tuple[str, ...] = ("fsm.lifecycles:PipelineLifecycle", "fsm.lifecycles:JobLifecycle")
"""The built-in lifecycles, exported to ``diagrams/`` by ``fsm diagram --write``."""


class LifecycleNotFound(FsmError):
    """A ``module:Class`` reference does not name an importable Lifecycle class."""

    def __init__(self, ref: str, problem: str) -> None:
        self.ref = ref
        self.problem = problem
        super().__init__(f"cannot load lifecycle {ref!r}: {problem}")


def ref_of(lifecycle: type[Lifecycle]) -> str:
    """``module:Qualname`` of a Lifecycle class."""
    return f"{lifecycle.__module__}:{lifecycle.__qualname__}"


def load_lifecycle(ref: str) -> type[Lifecycle]:
    """Import ``module:Class`` (``Class`` may be dotted, ``module:Outer.Inner``)."""
    module_name, sep, qualname = ref.partition(":")
    if not sep or not module_name or not qualname:
        raise LifecycleNotFound(ref, "expected MODULE:CLASS, e.g. fsm.lifecycles:JobLifecycle")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        hint = ""
        missing = getattr(err, "name", None)
        if isinstance(err, ModuleNotFoundError) and missing and (module_name + ".").startswith(missing + "."):
            hint = (
                f"; {module_name!r} is looked for on sys.path: run from the folder that holds it, "
                "or add that folder to PYTHONPATH"
            )
        raise LifecycleNotFound(ref, f"module {module_name!r} cannot be imported ({err}){hint}") from err
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise LifecycleNotFound(ref, f"{module_name!r} has no attribute {qualname!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, Lifecycle) and hasattr(obj, "table")):
        raise LifecycleNotFound(ref, f"{qualname!r} is not a Lifecycle subclass with states")
    return obj


def cwd_on_path() -> None:
    """Put the current directory first on ``sys.path``, as ``python -m`` does, so that
    ``fsm diagram mymodule:Flow`` finds ``mymodule.py`` in the folder it is run from (a
    console script has its own folder there instead, not the current one)."""
    cwd = os.getcwd()
    if not any(entry in ("", ".", cwd) for entry in sys.path):
        sys.path.insert(0, cwd)


def load_lifecycle_here(ref: str) -> type[Lifecycle]:
    """The command line's one loader (``fsm diagram``, ``fsm inspect``, ``fsm reaper``):
    :func:`load_lifecycle` with the current directory first on ``sys.path``, so that
    ``--lifecycle etl:EtlRun`` run in the folder holding ``etl.py`` finds it in every command."""
    cwd_on_path()
    return load_lifecycle(ref)


__all__ = ["BUILTINS", "LifecycleNotFound", "cwd_on_path", "load_lifecycle", "load_lifecycle_here", "ref_of"]
