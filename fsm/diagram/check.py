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

A Markdown file (``README.md``) can be checked too: each fenced ```` ```mermaid ```` block
that carries a provenance header must equal the lifecycle's Mermaid export; blocks without
one are left alone.
"""

from __future__ import annotations

import difflib
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from fsm.diagram.dot import to_dot
from fsm.diagram.export import TEXT_FORMATS, format_for_path, is_fresh, render
from fsm.diagram.extract import extract
from fsm.diagram.mermaid import to_mermaid
from fsm.diagram.provenance import Header, read_header, sha256_text
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
    line: int | None = None
    """Where a Markdown block starts (``None`` for a whole file)."""

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}" if self.line is not None else str(self.path)


@dataclass(frozen=True, slots=True)
class CheckReport:
    targets: tuple[Path, ...]
    findings: tuple[Finding, ...]
    problems: tuple[str, ...] = ()
    """Problems with a target itself (missing, or holding no exported diagram)."""

    @property
    def ok(self) -> bool:
        return not self.problems and all(f.status is Status.FRESH for f in self.findings)

    def count(self, status: Status) -> int:
        return sum(1 for f in self.findings if f.status is status)


def _diff(path: str, old: bytes, new: bytes) -> str:
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
        detail = _diff(str(path), data, render(diagram, fmt))
        return Finding(path, Status.STALE, f"differs from {header.ref} exported now; {regenerate}", header.ref, detail)
    now = sha256_text(to_dot(diagram))
    was = header.dot_sha256 or "none"
    return Finding(
        path,
        Status.STALE,
        f"rendered from DOT sha256 {was[:12]}, {header.ref} gives {now[:12]} now; {regenerate}",
        header.ref,
    )


_FENCE = re.compile(r"^```mermaid[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def check_markdown(path: Path) -> list[Finding]:
    """The verdict on each exported Mermaid block of a Markdown file (blocks with a header)."""
    text = path.read_text(encoding="utf-8")
    findings: list[Finding] = []
    for match in _FENCE.finditer(text):
        block = match.group(1)
        header = Header.parse(block)
        if header is None or header.format != "mermaid":
            continue
        line = text.count("\n", 0, match.start()) + 2  # the block's first line
        if header.entity is not None:
            findings.append(
                Finding(path, Status.ERROR, f"an export of stored entity {header.entity!r}", header.ref, line=line)
            )
            continue
        try:
            fresh = to_mermaid(extract(load_lifecycle(header.ref)))
        except FsmError as err:
            findings.append(Finding(path, Status.ERROR, str(err), header.ref, line=line))
            continue
        if block == fresh:
            findings.append(Finding(path, Status.FRESH, "matches its lifecycle", header.ref, line=line))
            continue
        where = f"{path}:{line}"
        findings.append(
            Finding(
                path,
                Status.STALE,
                f"Mermaid block differs from {header.ref} exported now; replace it with: fsm diagram {header.ref}",
                header.ref,
                _diff(where, block.encode(), fresh.encode()),
                line,
            )
        )
    return findings


def check(targets: Iterable[str | Path]) -> CheckReport:
    """Check each target: a directory (every diagram file directly inside it, by name) or a
    Markdown file (its exported Mermaid blocks)."""
    paths = tuple(Path(t) for t in targets)
    findings: list[Finding] = []
    problems: list[str] = []
    for root in paths:
        if root.is_file() and root.suffix.lower() in (".md", ".markdown"):
            found = check_markdown(root)
            if not found:
                problems.append(f"{root} holds no exported Mermaid block (one with an fsm-diagram header)")
            findings += found
        elif root.is_dir():
            files = sorted(p for p in root.iterdir() if p.is_file() and format_for_path(p) is not None)
            if not files:
                problems.append(f"{root} holds no diagram file (.mmd, .dot, .svg, .png)")
            findings += [check_file(p) for p in files]
        elif root.is_file() and format_for_path(root) is not None:
            findings.append(check_file(root))
        else:
            problems.append(f"{root} is not a directory, a Markdown file or a diagram file")
    if not paths:
        problems.append("nothing to check")
    return CheckReport(paths, tuple(findings), tuple(problems))


def check_dir(directory: str | Path) -> CheckReport:
    """Check every diagram file directly inside ``directory`` (sorted by name)."""
    return check([directory])


__all__ = ["CheckReport", "Finding", "Status", "check", "check_dir", "check_file", "check_markdown"]
