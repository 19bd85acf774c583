"""MkDocs hook: each tool page's flag tables are generated from the tool's parser, so the docs cannot drift.

A page writes ``<!-- flags: quantize int8 -->`` (the tool's words in ``onnxprec.cli.TOOLS``) where its flag tables
go; the hook builds that tool's argparse parser the way ``onnxprec`` does (its options dataclasses, the shared
argument groups) and replaces the marker with one table per argument group: every spelling, the value, the help
text with its default. ``python docs/hooks/flags.py "quantize int8"`` prints the same tables.
"""

from __future__ import annotations

import argparse
import html
import re
import sys
from typing import Any

MARKER = re.compile(r"<!--\s*flags:\s*([a-z0-9 ]+?)\s*-->")
VOCABULARY_MARKER = "<!-- vocabulary -->"


def tool_parser(words: str) -> argparse.ArgumentParser:
    """The parser of ``onnxprec <words>``, built as the command line builds it."""
    from onnxprec import cli

    module, help_text = cli._tool(words)
    parser = cli._parser(f"onnxprec {words}", help_text)
    cli._setup(parser, module, parser.prog)
    return parser


def _cell(text: str) -> str:
    return html.escape(" ".join(text.split()), quote=False).replace("|", "\\|")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0:
        return ""
    if action.choices is not None:
        shown = "\\|".join(str(c) for c in action.choices)
    else:
        shown = action.metavar if isinstance(action.metavar, str) else action.dest.upper()
    if action.nargs in ("*", "+"):
        shown += " ..."
    return f"`{shown}`"


def flag_tables(words: str) -> str:
    """Markdown: one table per argument group of the tool's command line (``--help`` left out)."""
    parser = tool_parser(words)
    sections = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if not isinstance(a, argparse._HelpAction)]
        if not actions:
            continue
        rows = ["| flag | value | what it does |", "| --- | --- | --- |"]
        for action in actions:
            spellings = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}` (positional)"
            required = " **(required)**" if action.required and action.option_strings else ""
            help_text = (action.help or "") % {"default": action.default, "prog": parser.prog}
            rows.append(f"| {spellings}{required} | {_value(action)} | {_cell(help_text)} |")
        sections.append(f"**{_cell(group.title or 'options')}**\n\n" + "\n".join(rows))
    return "\n\n".join(sections)


def vocabulary_table() -> str:
    """Markdown: each setting's spellings in every tool (``onnxprec._arg_groups.VOCABULARY``), which tools have it,
    and the other spellings they accept (deprecated ones marked)."""
    from onnxprec import cli
    from onnxprec._arg_groups import DEPRECATED, VOCABULARY

    tools: dict[str, list[str]] = {}
    for words, _, _ in cli.TOOLS:
        dests = {a.dest for a in tool_parser(words)._actions}
        for concept in VOCABULARY:
            if dests & set(concept.fields):
                tools.setdefault(concept.name, []).append(words)
    rows = ["| setting | spelling | also accepted | tools |", "| --- | --- | --- | --- |"]
    for concept in VOCABULARY:
        also = [f"`{a}` (deprecated: use `{DEPRECATED[a]}`)" if a in DEPRECATED else f"`{a}`" for a in concept.aliases]
        rows.append(
            f"| {concept.name} | {', '.join(f'`{s}`' for s in concept.spellings)} | {', '.join(also) or '–'} | "
            f"{', '.join(tools.get(concept.name, [])) or '–'} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """MkDocs event: replaces every flags marker of a page with the tool's generated tables (and the vocabulary
    marker with :func:`vocabulary_table`)."""
    if VOCABULARY_MARKER in markdown:
        markdown = markdown.replace(VOCABULARY_MARKER, vocabulary_table())
    return MARKER.sub(lambda m: flag_tables(m.group(1)), markdown)


if __name__ == "__main__":
    print(flag_tables(" ".join(sys.argv[1:]) or "autocast"))
