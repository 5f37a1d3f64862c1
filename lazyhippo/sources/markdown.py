"""Markdown read with markdown-it-py (CommonMark with tables and strikethrough): headings, paragraphs, list
items and table rows as plain text, code kept without its fences or backticks, links as their text."""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Iterator

from lazyhippo.sources.htmldoc import strip_tags
from lazyhippo.sources.markup import Event, Heading

_FRONT_MATTER = re.compile(r"\A---[ \t]*\n(.*?\n)(---|\.\.\.)[ \t]*(\n|\Z)", re.S)
_FRONT_TITLE = re.compile(r"^title:[ \t]*['\"]?(.*?)['\"]?[ \t]*$", re.M)


@lru_cache(maxsize=1)
def _parser():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])


def inline_text(children) -> str:
    out: list[str] = []
    for t in children or ():
        if t.type in ("text", "code_inline"):
            out.append(t.content)
        elif t.type == "softbreak":
            out.append(" ")
        elif t.type == "hardbreak":
            out.append("\n")
        elif t.type == "image":
            out.append(inline_text(t.children))
    return re.sub(r"[ \t]+", " ", "".join(out)).strip()


def events(text: str) -> Iterator[Event]:
    front = _FRONT_MATTER.match(text)
    if front:  # YAML front matter: its title is the document's, the rest is not text
        text = text[front.end():]
        title = _FRONT_TITLE.search(front.group(1))
        if title and title.group(1).strip():
            yield Heading(0, title.group(1).strip())
    tokens = _parser().parse(text)
    row: list[str] | None = None
    for i, t in enumerate(tokens):
        if t.type == "heading_open":
            yield Heading(int(t.tag[1]), inline_text(tokens[i + 1].children))
        elif t.type == "inline" and tokens[i - 1].type != "heading_open":
            if row is not None:
                row.append(inline_text(t.children))
            else:
                yield inline_text(t.children)
        elif t.type in ("fence", "code_block"):
            yield t.content.rstrip("\n")
        elif t.type == "html_block":
            yield strip_tags(t.content)
        elif t.type == "tr_open":
            row = []
        elif t.type == "tr_close":
            yield " | ".join(c for c in row or [] if c)
            row = None
