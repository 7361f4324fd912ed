"""A diagram in one format, as the bytes of a file; and a directory of exported lifecycles.

``render(diagram, "svg")`` runs Graphviz on the DOT text and stamps the image with its
provenance header (the lifecycle's ``module:Class`` and the SHA-256 of that DOT text), so
``fsm diagram --check`` can tell later whether the image is still the lifecycle's.

``write_dir`` names each file after the lifecycle's ``kind`` (``job.mmd``); it refuses,
before writing anything, a kind that is not a plain file name (``../x``, ``a/b``) and two
lifecycles that would write the same file.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from fsm.diagram.dot import to_dot
from fsm.diagram.extract import extract
from fsm.diagram.graphviz_render import GraphvizNotFound, find_dot, render_dot
from fsm.diagram.mermaid import to_mermaid
from fsm.diagram.model import Diagram
from fsm.diagram.provenance import Header, read_header, sha256_text, stamp_png, stamp_svg
from fsm.diagram.refs import BUILTINS, load_lifecycle
from fsm.errors import FsmError

FORMATS: tuple[str, ...] = ("mermaid", "dot", "svg", "png")
TEXT_FORMATS: tuple[str, ...] = ("mermaid", "dot")
SUFFIXES: dict[str, str] = {"mermaid": ".mmd", "dot": ".dot", "svg": ".svg", "png": ".png"}
WRITTEN_FORMATS: tuple[str, ...] = ("mermaid", "dot", "svg")
"""What ``fsm diagram --write DIR`` exports for each lifecycle."""

_BY_SUFFIX = {suffix: fmt for fmt, suffix in SUFFIXES.items()} | {".mermaid": "mermaid", ".gv": "dot"}
_NOT_IN_A_NAME = re.compile(r'[/\\:*?"<>|\x00-\x1f\x7f]')
"""Path separators, and what Windows refuses in a file name (the directory may be checked
out there): a kind holding one cannot name an exported file."""


class WriteRefused(FsmError):
    """``write_dir`` would write outside its directory, or two lifecycles to the same file;
    nothing was written."""


class Written(NamedTuple):
    """What ``write_dir`` did with one file."""

    path: Path
    status: str
    """``wrote``; ``fresh`` (already the lifecycle's: left alone); ``skipped`` (an image,
    with no Graphviz to draw it: ``note`` says why)."""
    note: str = ""

    @property
    def changed(self) -> bool:
        return self.status == "wrote"


def format_for_path(path: str | Path) -> str | None:
    """The format a file name implies (``.mmd``/``.mermaid``, ``.dot``/``.gv``, ``.svg``, ``.png``)."""
    return _BY_SUFFIX.get(Path(path).suffix.lower())


def render(diagram: Diagram, fmt: str) -> bytes:
    """The diagram as a file's bytes in ``fmt`` (one of :data:`FORMATS`).

    ``svg`` and ``png`` need Graphviz's ``dot`` program (``GraphvizNotFound`` otherwise).
    """
    if fmt == "mermaid":
        return to_mermaid(diagram).encode("utf-8")
    dot_text = to_dot(diagram)
    if fmt == "dot":
        return dot_text.encode("utf-8")
    if fmt not in FORMATS:
        raise ValueError(f"unknown diagram format {fmt!r}; choose one of {', '.join(FORMATS)}")
    header = Header(
        diagram.ref,
        fmt,
        dot_sha256=sha256_text(dot_text),
        entity=diagram.overlay.entity_id if diagram.overlay is not None else None,
    )
    image = render_dot(dot_text, fmt)
    return stamp_svg(image, header) if fmt == "svg" else stamp_png(image, header)


def file_name(diagram: Diagram, fmt: str) -> str:
    """``<kind><suffix>``: ``job.mmd``, ``pipeline.svg``.

    Raises :class:`WriteRefused` when the kind is not a plain file name: empty, ``.`` or
    ``..``, starting with a dot or a space, ending with a dot or a space, or holding a path
    separator or a character Windows refuses (``: * ? " < > |``, control characters).
    """
    kind = diagram.kind
    if (
        not isinstance(kind, str)
        or kind.strip(". ") == ""
        or kind[0] in ". "
        or kind[-1] in ". "
        or _NOT_IN_A_NAME.search(kind)
    ):
        raise WriteRefused(
            f"{diagram.ref} has kind {kind!r}, which cannot name a file (exports are named <kind>.mmd...): "
            "a kind with a path separator, a leading dot or a character such as : * ? would write outside "
            "the directory or fail on some systems; export it with --out FILE instead"
        )
    return f"{kind}{SUFFIXES[fmt]}"


def is_fresh(path: Path, diagram: Diagram, fmt: str) -> bool:
    """Whether the file at ``path`` is ``diagram`` exported in ``fmt``.

    Text formats must match byte for byte.  An image must carry the SHA-256 of the DOT text
    the diagram gives now: its pixels and SVG markup depend on the Graphviz version that
    drew it, the DOT text does not, so an image is never "stale" because of Graphviz.
    """
    if not path.is_file():
        return False
    data = path.read_bytes()
    if fmt in TEXT_FORMATS:
        return same_text(data, render(diagram, fmt))
    header = read_header(data)
    return (
        header is not None
        and header.ref == diagram.ref
        and header.format == fmt
        and header.entity is None
        and header.dot_sha256 == sha256_text(to_dot(diagram))
    )


def same_text(on_disk: bytes, exported: bytes) -> bool:
    """Whether a text file holds ``exported``, whatever its line endings (a checkout with
    ``core.autocrlf`` has CRLF where the export has LF)."""
    return on_disk.replace(b"\r\n", b"\n") == exported.replace(b"\r\n", b"\n")


def write_dir(
    directory: str | Path,
    refs: Iterable[str] = BUILTINS,
    formats: Iterable[str] = WRITTEN_FORMATS,
    *,
    force: bool = False,
) -> list[Written]:
    """Export each ``module:Class`` in ``refs`` into ``directory`` in each of ``formats``.

    Every lifecycle is loaded and every file named first: a kind that cannot name a file
    (:func:`file_name`), two lifecycles naming the same file (``kind`` is the same, or
    differs in case only), or a file in ``directory`` exported from another lifecycle
    (unless ``force``) raise :class:`WriteRefused` before anything is written.

    A file that is already fresh is left alone (so an image is not redrawn, and churned,
    by another Graphviz version) unless ``force``.  When an image has to be drawn and
    there is no Graphviz, the text formats are still written and each such image is
    reported ``skipped`` (its ``note`` says why): check for it.
    """
    out = Path(directory)
    fmts = tuple(formats)
    for fmt in fmts:
        if fmt not in FORMATS:
            raise ValueError(f"unknown diagram format {fmt!r}; choose one of {', '.join(FORMATS)}")
    plan: list[tuple[Diagram, str, Path]] = []
    owners: dict[str, str] = {}
    for ref in refs:
        diagram = extract(load_lifecycle(ref))
        if diagram.ref in owners.values():  # named twice (or by two names of the same class)
            continue
        for fmt in fmts:
            name = file_name(diagram, fmt)
            other = owners.get(name.casefold())
            if other is not None:
                raise WriteRefused(
                    f"{other} and {diagram.ref} would both be written to {out / name} (kind {diagram.kind!r}); "
                    "give one of them its own kind (kind = '...' in the class) or write them to different "
                    "directories; nothing was written"
                )
            owners[name.casefold()] = diagram.ref
            path = out / name
            if not force and path.is_file():
                header = read_header(path.read_bytes())
                if header is not None and header.ref != diagram.ref:
                    raise WriteRefused(
                        f"{path} holds the export of {header.ref}, not of {diagram.ref} (same kind "
                        f"{diagram.kind!r}); delete it, or replace it with --force (force=True); nothing was written"
                    )
            plan.append((diagram, fmt, path))
    out.mkdir(parents=True, exist_ok=True)
    results: list[Written] = []
    graphviz: GraphvizNotFound | bool | None = None  # not looked for yet / missing / found
    for diagram, fmt, path in plan:
        if not force and is_fresh(path, diagram, fmt):
            results.append(Written(path, "fresh"))
            continue
        if fmt not in TEXT_FORMATS:
            if graphviz is None:
                try:
                    graphviz = bool(find_dot())
                except GraphvizNotFound as err:
                    graphviz = err
            if isinstance(graphviz, GraphvizNotFound):
                results.append(Written(path, "skipped", str(graphviz)))
                continue
        path.write_bytes(render(diagram, fmt))
        results.append(Written(path, "wrote"))
    return results


__all__ = [
    "FORMATS",
    "SUFFIXES",
    "TEXT_FORMATS",
    "WRITTEN_FORMATS",
    "WriteRefused",
    "Written",
    "file_name",
    "format_for_path",
    "is_fresh",
    "render",
    "same_text",
    "write_dir",
]
