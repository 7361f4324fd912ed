"""MkDocs hooks and a Griffe extension for the documentation site.

The pages are written under ``docs/pages/``; the hooks only add what lives elsewhere in the
repository: ``CHANGELOG.md`` as the changelog page, and the diagrams and screenshots of
``diagrams/`` that pages link to (``../diagrams/job.svg``).  ``mkdocs build --strict`` fails
on a link that does not resolve.

:class:`SphinxRoles` (loaded by mkdocstrings, ``extensions: [hooks.py:SphinxRoles]``) turns
the docstrings' Sphinx roles (``:class:`Job```, ``:meth:`Engine.run```) into cross-references
that mkdocstrings renders as links where the target is documented (plain code elsewhere),
and drops the project's internal references (seed document numbers, issue numbers, design
sections), which mean nothing to a reader of the site.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from griffe import Extension, Object
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent

_ROLE = re.compile(
    r":(?:py:)?(?:meth|class|func|mod|attr|data|exc|obj|const):`(~?)([^`<>]+)`"
)
_INTERNAL = [
    (re.compile(r" \((?:DESIGN sections? [\d, and]+|issues? \d+)\)"), ""),
    (re.compile(r"\(seeds/000\)"), "(the zombie-pipeline incident)"),
    (
        re.compile(r"\(seeds/002(?: [A-Z]+-\d+)?\)"),
        "(the live-finalizer incident)",
    ),
    (re.compile(r"seeds/000's"), "the zombie-pipeline incident's"),
    (re.compile(r"seeds/000"), "the zombie-pipeline incident"),
    (re.compile(r"seeds/002"), "the live-finalizer incident"),
    (re.compile(r"DESIGN sections? [\d, and]+"), "the design"),
    (re.compile(r"\(issue \d+\)"), ""),
]


def clean(text: str) -> str:
    """A docstring without the project's internal references."""
    for pattern, replacement in _INTERNAL:
        text = pattern.sub(replacement, text)
    return text


def roles(text: str, obj: Object | None = None) -> str:
    """``:meth:`x``` as an optional cross-reference to ``x`` (resolved in ``obj``'s scope)."""

    def link(m: re.Match[str]) -> str:
        target = m.group(2).strip().removesuffix("()")
        shown = target.rsplit(".", 1)[-1] if m.group(1) else target
        identifier = target
        if obj is not None:
            try:
                identifier = obj.resolve(target)
            except (
                Exception
            ):  # a name Griffe cannot resolve: autorefs tries it as written
                identifier = target
        return f'<autoref identifier="{identifier}" optional><code>{shown}</code></autoref>'

    return _ROLE.sub(link, text)


class SphinxRoles(Extension):
    """Rewrites each docstring once it is loaded (see the module's docstring)."""

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        """Once the whole package is loaded, so that every name resolves."""
        todo = [pkg]
        while todo:
            obj = todo.pop()
            if obj.docstring is not None:
                obj.docstring.value = roles(clean(obj.docstring.value), obj)
            todo.extend(
                member
                for member in obj.members.values()
                if not member.is_alias
            )  # type: ignore[misc]


_CLI_HELP = re.compile(r"<!-- fsm-help: ([a-z-]+) -->")


def cli_help(name: str) -> str:
    """``fsm NAME --help`` as the command prints it on an 80-column terminal: the options
    on the page are the parser's own, never a copy that drifts."""
    import argparse
    import os

    from fsm.cli import build_parser

    columns = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "80"
    try:
        parser = build_parser()
        (commands,) = (
            a
            for a in parser._actions
            if isinstance(a, argparse._SubParsersAction)
        )
        text = commands.choices[name].format_help()
    finally:
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns
    return f"```text\n{text.rstrip()}\n```"


def on_page_markdown(
    markdown: str, page: Any, config: Any, files: Files
) -> str:
    return _CLI_HELP.sub(lambda m: cli_help(m.group(1)), markdown)


def on_files(files: Files, config: Any) -> Files:
    # the home page is the README (one text for both front doors: nothing said twice),
    # its links into the site made relative to the site
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(
        File.generated(
            config,
            "index.md",
            content=clean(readme.replace("](docs/pages/", "](")),
        )
    )
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(
        File.generated(config, "changelog.md", content=clean(changelog))
    )
    for picture in sorted((ROOT / "diagrams").rglob("*")):
        if picture.suffix in {".svg", ".png"}:
            uri = (
                "diagrams/" + picture.relative_to(ROOT / "diagrams").as_posix()
            )
            files.append(
                File.generated(config, uri, content=picture.read_bytes())
            )
    return files


_CDN = re.compile(r"https://unpkg\.com/[^\"'\\\s]*")
_SOURCE_MAP = re.compile(r"\n?//# sourceMappingURL=\S+\.map")


def on_post_build(config: Any) -> None:
    """Keep the built site offline: the theme's bundle names two scripts it would load from
    a CDN, Mermaid (for a page with a mermaid fence: these pages have none, the diagrams are
    SVG files) and a ResizeObserver polyfill (for browsers without one); both become empty
    ``data:`` scripts, so nothing is ever fetched from elsewhere.  The bundles' source maps
    (a debugging aid that quotes the theme's sources) are left out."""
    for path in (Path(config["site_dir"]) / "assets").rglob("*.js*"):
        if path.suffix == ".map":
            path.unlink()
            continue
        text = path.read_text(encoding="utf-8")
        cleaned = _SOURCE_MAP.sub("", _CDN.sub("data:,", text))
        if cleaned != text:
            path.write_text(cleaned, encoding="utf-8")
