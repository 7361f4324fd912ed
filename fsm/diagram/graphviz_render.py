"""DOT text -> SVG or PNG, by running Graphviz's ``dot`` program.

No Python package is needed: the ``graphviz`` and ``pydot`` packages both run this same
program through a subprocess, so depending on either would add an install step and no
capability.  Only the SVG and PNG formats need Graphviz; Mermaid and DOT text never do.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from fsm.errors import FsmError

RENDERED_FORMATS = ("svg", "png")

INSTALL_HINT = (
    "install Graphviz: `apt-get install graphviz` (Debian/Ubuntu), `brew install graphviz` (macOS), "
    "`choco install graphviz` (Windows) or see https://graphviz.org/download/; "
    "or set FSM_GRAPHVIZ_DOT to the path of the `dot` program"
)
DOT_ENV = "FSM_GRAPHVIZ_DOT"
"""An explicit path to Graphviz's ``dot`` program (default: ``dot`` found on PATH)."""


class GraphvizNotFound(FsmError):
    """Graphviz's ``dot`` program is not installed (or not on PATH)."""

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted
        super().__init__(f"Graphviz's `dot` program was not found ({wanted}); SVG and PNG need it: {INSTALL_HINT}")


class GraphvizFailed(FsmError):
    """``dot`` ran and refused the input (a syntax error, an unknown format...)."""

    def __init__(self, returncode: int, stderr: str) -> None:
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(f"Graphviz `dot` failed with exit code {returncode}: {stderr.strip()}")


def find_dot() -> str:
    """The path of the ``dot`` program: ``$FSM_GRAPHVIZ_DOT``, else ``dot`` on ``PATH``."""
    explicit = os.environ.get(DOT_ENV)
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise GraphvizNotFound(f"{DOT_ENV}={explicit!r} is not an executable")
        return found
    found = shutil.which("dot")
    if found is None:
        raise GraphvizNotFound("no `dot` on PATH")
    return found


def graphviz_version(dot: str | None = None) -> str:
    """What ``dot -V`` says (``dot - graphviz version 2.43.0 (0)``)."""
    result = subprocess.run([dot or find_dot(), "-V"], capture_output=True, text=True, check=False, timeout=30)
    return (result.stderr or result.stdout).strip()


def render_dot(source: str, fmt: str, *, dot: str | None = None, timeout: float = 60.0) -> bytes:
    """Run ``dot -T<fmt>`` on ``source``; the image's bytes.

    Raises :class:`GraphvizNotFound` (with install instructions) when there is no ``dot``,
    :class:`GraphvizFailed` when it rejects the input.
    """
    if fmt not in RENDERED_FORMATS:
        raise ValueError(f"Graphviz renders {', '.join(RENDERED_FORMATS)} here, not {fmt!r}")
    program = dot or find_dot()
    try:
        result = subprocess.run(
            [program, f"-T{fmt}"], input=source.encode("utf-8"), capture_output=True, check=False, timeout=timeout
        )
    except FileNotFoundError as err:  # vanished between lookup and run
        raise GraphvizNotFound(f"{program!r} cannot be run") from err
    if result.returncode != 0:
        raise GraphvizFailed(result.returncode, result.stderr.decode("utf-8", errors="replace"))
    return result.stdout


__all__ = [
    "DOT_ENV",
    "INSTALL_HINT",
    "GraphvizFailed",
    "GraphvizNotFound",
    "find_dot",
    "graphviz_version",
    "render_dot",
]
