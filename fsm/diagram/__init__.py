"""Diagram export: a lifecycle (or one stored entity) drawn for a review.

A pipeline, one concept per module::

    Lifecycle class --extract--> Diagram (model) --to_mermaid / to_dot--> text
                                                 --render(..., "svg"/"png")--> Graphviz image

::

    from fsm.diagram import extract, render, to_dot, to_mermaid
    from fsm.lifecycles import JobLifecycle

    print(to_mermaid(extract(JobLifecycle)))
    svg = render(extract(JobLifecycle, store=store, entity_id="job-42"), "svg")

``import fsm`` does not import this package; Graphviz (the ``dot`` program) is needed for
SVG and PNG only.
"""

from fsm.diagram.check import CheckReport, Finding, Status, check, check_dir, check_file, check_markdown
from fsm.diagram.dot import to_dot
from fsm.diagram.export import (
    FORMATS,
    SUFFIXES,
    WriteRefused,
    Written,
    file_name,
    format_for_path,
    is_fresh,
    render,
    write_dir,
)
from fsm.diagram.extract import DEFAULT_LAST, entity_overlay, extract
from fsm.diagram.graphviz_render import GraphvizFailed, GraphvizNotFound, find_dot, render_dot
from fsm.diagram.mermaid import to_mermaid
from fsm.diagram.model import Diagram, Edge, HistoryRow, Node, Overlay
from fsm.diagram.provenance import Header, read_header
from fsm.diagram.refs import BUILTINS, LifecycleNotFound, load_lifecycle, ref_of

__all__ = [
    "BUILTINS",
    "DEFAULT_LAST",
    "FORMATS",
    "SUFFIXES",
    "CheckReport",
    "Diagram",
    "Edge",
    "Finding",
    "GraphvizFailed",
    "GraphvizNotFound",
    "Header",
    "HistoryRow",
    "LifecycleNotFound",
    "Node",
    "Overlay",
    "Status",
    "WriteRefused",
    "Written",
    "check",
    "check_dir",
    "check_file",
    "check_markdown",
    "entity_overlay",
    "extract",
    "file_name",
    "find_dot",
    "format_for_path",
    "is_fresh",
    "load_lifecycle",
    "read_header",
    "ref_of",
    "render",
    "render_dot",
    "to_dot",
    "to_mermaid",
    "write_dir",
]
