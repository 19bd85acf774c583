"""The documentation site: every tool has a page whose flag tables are generated from its parser."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from onnxprec.cli import TOOLS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _hook():
    spec = importlib.util.spec_from_file_location("docs_flags_hook", DOCS / "hooks" / "flags.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_tool_has_a_page_with_its_generated_flags() -> None:
    hook = _hook()
    markers = {m.group(1) for page in DOCS.rglob("*.md") for m in hook.MARKER.finditer(page.read_text())}
    assert markers == {words for words, _, _ in TOOLS}


@pytest.mark.parametrize("words", [words for words, _, _ in TOOLS])
def test_flag_tables_list_every_spelling_and_help(words: str) -> None:
    hook = _hook()
    tables = hook.flag_tables(words)
    parser = hook.tool_parser(words)
    for action in parser._actions:
        for spelling in action.option_strings:
            if spelling in ("-h", "--help"):
                assert f"`{spelling}`" not in tables
            else:
                assert f"`{spelling}`" in tables
        if action.help and action.option_strings and "-h" not in action.option_strings:
            first_words = " ".join(action.help.split()[:4])
            assert hook._cell(first_words) in tables
    assert re.search(r"^\| flag \| value \| what it does \|$", tables, re.MULTILINE)


def test_marker_is_replaced_in_a_page() -> None:
    page = _hook().on_page_markdown("# x\n\n<!-- flags: dump -->\n")
    assert "<!--" not in page and "`--output_dir`" in page


@pytest.mark.slow
@pytest.mark.skipif(
    shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed: pip install -e '.[docs]'",
)
def test_site_builds_strict(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "site" / "tools" / "int8" / "index.html").read_text().count("<tr>") > 20
