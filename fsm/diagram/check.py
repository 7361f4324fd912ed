"""``fsm diagram --check DIR``: is every exported diagram in DIR still its lifecycle's?

Each exported file names its lifecycle in its provenance header
(:mod:`fsm.diagram.provenance`); the check imports that lifecycle, exports it again and
compares:

- Mermaid and DOT text byte for byte (a unified diff is shown for a stale file);
- SVG and PNG by the SHA-256 of the DOT text they were rendered from.  Graphviz versions
  draw the same DOT differently, so comparing images would flap between machines; the DOT
  text is produced by this package alone and does not.  The check needs no Graphviz.

A file with a diagram suffix (``.mmd``, ``.mermaid``, ``.dot``, ``.gv``, ``.svg``, ``.png``)
but no header, a header naming a lifecycle that cannot be imported, or an export of one
stored entity (a snapshot of data, never "fresh") is an error; other files are ignored.
"""

from __future__ import annotations

import difflib
import enum
from dataclasses import dataclass
from pathlib import Path

from fsm.diagram.dot import to_dot
from fsm.diagram.export import TEXT_FORMATS, format_for_path, is_fresh, render
from fsm.diagram.extract import extract
from fsm.diagram.provenance import read_header, sha256_text
from fsm.diagram.refs import load_lifecycle
from fsm.errors import FsmError

DIFF_LINES = 40
"""At most this many lines of diff are shown per stale text file."""


class Status(enum.StrEnum):
    FRESH = "fresh"
    STALE = "stale"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Finding:
    """The verdict on one file."""

    path: Path
    status: Status
    message: str
    ref: str | None = None
    detail: str = ""
    """A diff of a stale text file, or nothing."""


@dataclass(frozen=True, slots=True)
class CheckReport:
    directory: Path
    findings: tuple[Finding, ...]
    problem: str | None = None
    """A problem with the directory itself (missing, or holding no diagram)."""

    @property
    def ok(self) -> bool:
        return self.problem is None and all(f.status is Status.FRESH for f in self.findings)

    def count(self, status: Status) -> int:
        return sum(1 for f in self.findings if f.status is status)


def _diff(path: Path, old: bytes, new: bytes) -> str:
    lines = list(
        difflib.unified_diff(
            old.decode("utf-8", errors="replace").splitlines(),
            new.decode("utf-8", errors="replace").splitlines(),
            fromfile=f"{path} (on disk)",
            tofile=f"{path} (exported now)",
            lineterm="",
        )
    )
    if len(lines) > DIFF_LINES:
        lines = [*lines[:DIFF_LINES], f"... ({len(lines) - DIFF_LINES} more diff lines)"]
    return "\n".join(lines)


def check_file(path: Path) -> Finding:
    """The verdict on one exported file."""
    fmt = format_for_path(path)
    data = path.read_bytes()
    header = read_header(data)
    if header is None:
        return Finding(path, Status.ERROR, "no fsm-diagram header: cannot tell which lifecycle it shows")
    if header.entity is not None:
        return Finding(
            path,
            Status.ERROR,
            f"an export of stored entity {header.entity!r} (a snapshot of data, not of the lifecycle); "
            "keep entity exports out of a checked directory",
            ref=header.ref,
        )
    if fmt is None or header.format != fmt:
        return Finding(path, Status.ERROR, f"header says format {header.format!r}, file name says {fmt!r}", header.ref)
    try:
        diagram = extract(load_lifecycle(header.ref))
    except FsmError as err:
        return Finding(path, Status.ERROR, str(err), header.ref)
    if is_fresh(path, diagram, fmt):
        return Finding(path, Status.FRESH, "matches its lifecycle", header.ref)
    regenerate = f"regenerate: fsm diagram {header.ref} --format {fmt} --out {path}"
    if fmt in TEXT_FORMATS:
        detail = _diff(path, data, render(diagram, fmt))
        return Finding(path, Status.STALE, f"differs from {header.ref} exported now; {regenerate}", header.ref, detail)
    now = sha256_text(to_dot(diagram))
    was = header.dot_sha256 or "none"
    return Finding(
        path,
        Status.STALE,
        f"rendered from DOT sha256 {was[:12]}, {header.ref} gives {now[:12]} now; {regenerate}",
        header.ref,
    )


def check_dir(directory: str | Path) -> CheckReport:
    """Check every diagram file directly inside ``directory`` (sorted by name)."""
    root = Path(directory)
    if not root.is_dir():
        return CheckReport(root, (), problem=f"{root} is not a directory")
    files = sorted(p for p in root.iterdir() if p.is_file() and format_for_path(p) is not None)
    if not files:
        return CheckReport(root, (), problem=f"{root} holds no diagram file (.mmd, .dot, .svg, .png)")
    return CheckReport(root, tuple(check_file(p) for p in files))


__all__ = ["CheckReport", "Finding", "Status", "check_dir", "check_file"]
