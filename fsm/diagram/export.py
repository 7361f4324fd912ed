"""A diagram in one format, as the bytes of a file; and a directory of exported lifecycles.

``render(diagram, "svg")`` runs Graphviz on the DOT text and stamps the image with its
provenance header (the lifecycle's ``module:Class`` and the SHA-256 of that DOT text), so
``fsm diagram --check`` can tell later whether the image is still the lifecycle's.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from fsm.diagram.dot import to_dot
from fsm.diagram.extract import extract
from fsm.diagram.graphviz_render import render_dot
from fsm.diagram.mermaid import to_mermaid
from fsm.diagram.model import Diagram
from fsm.diagram.provenance import Header, read_header, sha256_text, stamp_png, stamp_svg
from fsm.diagram.refs import BUILTINS, load_lifecycle

FORMATS: tuple[str, ...] = ("mermaid", "dot", "svg", "png")
TEXT_FORMATS: tuple[str, ...] = ("mermaid", "dot")
SUFFIXES: dict[str, str] = {"mermaid": ".mmd", "dot": ".dot", "svg": ".svg", "png": ".png"}
WRITTEN_FORMATS: tuple[str, ...] = ("mermaid", "dot", "svg")
"""What ``fsm diagram --write DIR`` exports for each lifecycle."""

_BY_SUFFIX = {suffix: fmt for fmt, suffix in SUFFIXES.items()} | {".mermaid": "mermaid", ".gv": "dot"}


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
    """``<kind><suffix>``: ``job.mmd``, ``pipeline.svg``."""
    return f"{diagram.kind}{SUFFIXES[fmt]}"


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
        return data == render(diagram, fmt)
    header = read_header(data)
    return (
        header is not None
        and header.ref == diagram.ref
        and header.format == fmt
        and header.entity is None
        and header.dot_sha256 == sha256_text(to_dot(diagram))
    )


def write_dir(
    directory: str | Path,
    refs: Iterable[str] = BUILTINS,
    formats: Iterable[str] = WRITTEN_FORMATS,
    *,
    force: bool = False,
) -> list[tuple[Path, bool]]:
    """Export each ``module:Class`` in ``refs`` into ``directory`` in each of ``formats``.

    Returns ``(path, changed)`` pairs in order.  A file that is already fresh is left alone
    (so an image is not redrawn, and churned, by another Graphviz version) unless ``force``.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    results: list[tuple[Path, bool]] = []
    fmts = tuple(formats)
    for ref in refs:
        diagram = extract(load_lifecycle(ref))
        for fmt in fmts:
            path = out / file_name(diagram, fmt)
            if not force and is_fresh(path, diagram, fmt):
                results.append((path, False))
                continue
            path.write_bytes(render(diagram, fmt))
            results.append((path, True))
    return results


__all__ = [
    "FORMATS",
    "SUFFIXES",
    "TEXT_FORMATS",
    "WRITTEN_FORMATS",
    "file_name",
    "format_for_path",
    "is_fresh",
    "render",
    "write_dir",
]
