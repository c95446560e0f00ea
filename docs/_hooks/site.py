"""MkDocs hooks (mkdocs.yml ``hooks``): pages that show a file kept at the top of the
repository instead of a copy that could drift.

- ``<!-- readme: demo summary -->``: the demo block of README.md, between the markers that
  ``edge-sdk demo`` writes (docs/demo.md);
- ``<!-- changelog: ... -->``: CHANGELOG.md (docs/changelog.md).
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BEGIN = "<!-- begin: written by `edge-sdk demo`"
END = "<!-- end: written by `edge-sdk demo` -->"


def _readme_demo_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def on_page_markdown(markdown: str, page, config, files) -> str:
    if "<!-- readme: demo summary -->" in markdown:
        markdown = markdown.replace("<!-- readme: demo summary -->", _readme_demo_block())
    if re.search(r"<!-- changelog:", markdown):
        markdown = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    return markdown
