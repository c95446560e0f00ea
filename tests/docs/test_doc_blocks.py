"""Every code block of README.md and docs/*.md runs (issue 34 goal 2), with Sybil.

- ```` ```python ```` blocks run in this process, one namespace per page, in page order, in a
  copy of the checkout ``conftest.docs_checkout`` builds (a trained digits model, the demo's
  bundle at ``runs/demo/bundle``, ``bundle/``, ``x.npy``). Names a page uses without defining
  them stand for the app's own: ``x`` (one digits sample), ``xs`` (64 of them),
  ``ask_a_human()`` and ``serve()`` (do nothing).
- ```` ```bash ```` blocks run with ``bash -euo pipefail`` in the same copy, this venv first
  on PATH; a non-zero exit fails the block.
- A block that cannot run here is preceded by ``<!-- skip: next "why" -->`` (a network
  download, a GPU, installing into your environment, the full demo). At most 10 % may be.

Each block is one test (``tests/docs/test_doc_blocks.py::test_block[docs/runtime.md:42]``);
asking for one runs the page's earlier blocks first. ``pytest tests/docs -q -rs`` prints the
executed and skipped counts and every skip's reason.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sybil import Document, Example
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

from docs_support import ROOT, digits_test_split, shell_env

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_TIMEOUT_S = 600
MAX_SKIPPED = 0.10


def _shell(example: Example) -> str | None:
    checkout = example.namespace["__checkout__"]
    res = subprocess.run(["bash", "-euo", "pipefail", "-c", example.parsed], cwd=checkout,
                         env=shell_env(checkout), capture_output=True, text=True,
                         timeout=SHELL_TIMEOUT_S, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        return (f"exit code {res.returncode}\n--- stdout (end)\n{res.stdout[-3000:]}\n"
                f"--- stderr (end)\n{res.stderr[-3000:]}")
    return None


PARSERS = [PythonCodeBlockParser(), CodeBlockParser("bash", _shell), SkipParser()]


def _parse(path: Path) -> Document:
    return Document.parse(str(path), *PARSERS)


def _blocks() -> list[tuple[str, int]]:
    """(page, index among the page's regions) of every code block, in page order."""
    out = []
    for page in PAGES:
        for i, ex in enumerate(_parse(page)):
            if not isinstance(ex.region.evaluator, type(PARSERS[2].skipper)):
                out.append((page.relative_to(ROOT).as_posix(), i))
    return out


BLOCKS = _blocks()


class _Page:
    """One page's document, its checkout and how far it has run."""

    def __init__(self, page: str, checkout: Path):
        self.doc = _parse(ROOT / page)
        self.examples = list(self.doc)
        self.checkout = checkout
        self.done: dict[int, BaseException | None] = {}
        xs, _ = digits_test_split()
        self.doc.namespace.update(
            __checkout__=checkout, __name__="__main__", x=xs[-1], xs=xs[:64],
            ask_a_human=lambda *a, **k: None, serve=lambda *a, **k: None)

    def run(self, upto: int) -> None:
        for i in range(len(self.done), upto + 1):
            try:
                self.examples[i].evaluate()
                self.done[i] = None
            except BaseException as exc:  # noqa: BLE001 - kept, re-raised by its own test
                self.done[i] = exc
        exc = self.done[upto]
        if exc is not None:
            raise exc


_pages: dict[str, _Page] = {}


@pytest.fixture
def page_runner(request, docs_checkout: Path, tmp_path_factory, monkeypatch):
    def get(page: str) -> _Page:
        if page not in _pages:
            dst = tmp_path_factory.mktemp("page") / "checkout"
            shutil.copytree(docs_checkout, dst, symlinks=True)
            (dst / ".cache").mkdir()
            _pages[page] = _Page(page, dst)
        p = _pages[page]
        monkeypatch.chdir(p.checkout)  # python blocks open paths relative to the checkout
        monkeypatch.setenv("EDGE_SDK_CACHE", str(p.checkout / ".cache"))
        monkeypatch.setenv("MPLBACKEND", "Agg")
        return p
    return get


def _line(page: str, i: int) -> int:
    return list(_parse(ROOT / page))[i].line


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{p}:{_line(p, i)}" for p, i in BLOCKS])
def test_block(block: tuple[str, int], page_runner) -> None:
    page, i = block
    page_runner(page).run(i)


# --- what the run above must cover --------------------------------------------------------

FENCE = re.compile(r"^```(\S*)", re.M)
SKIP = re.compile(r'<!-- skip: next "([^"]+)" -->\n+```')
SHELL_LANGS = {"sh", "shell", "console", "zsh", "bash"}


def _fences(page: Path) -> list[str]:
    langs, inside = [], False
    for m in FENCE.finditer(page.read_text()):
        if not inside:
            langs.append(m.group(1))
        inside = not inside
    return langs


def test_every_python_and_shell_block_is_collected() -> None:
    """Only ``python`` and ``bash`` are run: a block tagged ``sh``/``shell``/``console`` (or an
    untagged one holding commands) would silently escape, so none may exist."""
    stray = []
    for page in PAGES:
        text = page.read_text()
        for m in re.finditer(r"^```(\S*)\n(.*?)^```", text, re.M | re.S):
            lang, body = m.group(1), m.group(2)
            first = next((ln.strip() for ln in body.splitlines() if ln.strip()), "")
            if lang in SHELL_LANGS - {"bash"} or lang == "py":
                stray.append(f"{page.name}: a ```{lang} block")
            elif lang in ("", "text") and re.match(
                    r"(\$ |edge-sdk |python|\.venv/|pip |make |torchrun |[A-Z_]+=)", first):
                stray.append(f"{page.name}: an untagged block of commands: {first[:60]}")
    assert not stray, "\n".join(stray)


def test_at_most_ten_percent_of_the_blocks_are_skipped_each_with_a_reason() -> None:
    run = len(BLOCKS)
    skipped = []
    for page in PAGES:
        text = page.read_text()
        assert "<!-- skip: start" not in text, f"{page.name}: skip blocks one at a time"
        for bad in re.findall(r"<!-- skip: next(?! \"[^\"]{10,}\" -->)[^>]*-->", text):
            pytest.fail(f"{page.name}: a skip without a reason: {bad}")
        skipped += [f"{page.name}: {r}" for r in SKIP.findall(text)]
    assert len(skipped) <= MAX_SKIPPED * run, (len(skipped), run, skipped)
    print(f"\ndoc blocks: {run} collected, {run - len(skipped)} executed, {len(skipped)} "
          f"skipped ({', '.join(skipped)})")
