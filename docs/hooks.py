"""MkDocs hooks: the guide pages are README.md's sections, generated at build time.

Each ``## `` section of the README becomes one page (its ``### `` headings one level up),
in the README's order; links to another section's anchor point at that section's page,
and links into ``diagrams/`` at the copies of the diagrams and screenshots added to the
site.  CHANGELOG.md is the changelog page.  So the README stays the one source of the
guide, and ``mkdocs build --strict`` fails on a link that no longer resolves.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
_HEADING = re.compile(r"^## (.+)$", re.M)


def slug(title: str) -> str:
    """The anchor GitHub and Python-Markdown's toc give a heading (lower case, dashes)."""
    text = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return re.sub(r"[ ]+", "-", text)


def sections(readme: str) -> tuple[str, list[tuple[str, str]]]:
    """The README's intro, and its ``## `` sections as (title, body)."""
    parts = _HEADING.split(readme)
    intro, rest = parts[0], parts[1:]
    return intro, [(rest[i].strip(), rest[i + 1]) for i in range(0, len(rest), 2)]


def page(title: str, body: str, pages: dict[str, str], depth: int) -> str:
    """One section as a page: its title the page's, links fixed for where the page lives."""
    up = "../" * depth
    body = re.sub(r"^### ", "## ", body, flags=re.M)
    body = re.sub(r"^#### ", "### ", body, flags=re.M)

    def anchor(m: re.Match[str]) -> str:
        target = pages.get(m.group(1))
        return f"]({up}{target})" if target is not None else m.group(0)

    body = re.sub(r"\]\(#([\w\-]+)\)", anchor, body)
    body = body.replace("](diagrams/", f"]({up}diagrams/")
    return f"# {title}\n{body}"


def on_files(files: Files, config: Any) -> Files:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    intro, found = sections(readme)
    pages = {slug(title): f"guide/{i:02d}-{slug(title)}.md" for i, (title, _) in enumerate(found, 1)}
    for (title, body), path in zip(found, pages.values(), strict=True):
        files.append(File.generated(config, path, content=page(title, body, pages, 1)))
    overview = re.sub(r"^# .*\n", "", intro, count=1)
    files.append(File.generated(config, "guide/00-overview.md", content=page("Overview", overview, pages, 1)))
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "changelog.md", content=changelog))
    for picture in sorted((ROOT / "diagrams").rglob("*")):
        if picture.suffix in {".svg", ".png"}:
            uri = "diagrams/" + picture.relative_to(ROOT / "diagrams").as_posix()
            files.append(File.generated(config, uri, content=picture.read_bytes()))
    config["nav"] = [
        {"Home": "index.md"},
        {"Guide": ["guide/00-overview.md", *pages.values()]},
        {"Scenarios": sorted(f"scenarios/{p.name}" for p in (Path(config["docs_dir"]) / "scenarios").glob("*.md"))},
        {"Diagrams": "diagrams.md"},
        {"API reference": sorted(f"reference/{p.name}" for p in (Path(config["docs_dir"]) / "reference").glob("*.md"))},
        {"Changelog": "changelog.md"},
    ]
    return files
