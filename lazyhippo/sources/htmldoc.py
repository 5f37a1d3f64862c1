"""HTML read with the standard library's parser: h1-h6 are the headings, block elements end a line, <pre>
keeps its lines, table cells join with " | "; scripts, styles, navigation and forms are not text. The page's one
top heading is its title ("Sync & Share" rather than "Sync & Share - Site"); a page without one, whose headings are
its sections ("1. Overview", "2. Syntax"), takes its <title>."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Iterator

from lazyhippo.sources.markup import Event, Heading

_SKIP = {"script", "style", "noscript", "template", "svg", "nav", "button", "select", "iframe", "object"}
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
_BLOCK = {"p", "div", "li", "dt", "dd", "tr", "blockquote", "section", "article", "aside", "header", "footer", "main",
          "ul", "ol", "dl", "table", "thead", "tbody", "figure", "figcaption", "caption", "details", "summary",
          "form", "fieldset", "address", "hr", "body", "html"}
_HEADINGS = {"h1", "h2", "h3", "h4", "h5", "h6"}


class _Reader(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[Event] = []
        self.buf: list[str] = []
        self.cells: list[str] | None = None
        self.skip = 0       # depth inside elements that are not text
        self.pre = 0        # depth inside <pre>
        self.title: list[str] | None = None
        self.page_title = ""

    def _line(self) -> str:
        text = "".join(self.buf)
        self.buf = []
        return text.strip("\n") if self.pre else re.sub(r"\s+", " ", text).strip()

    def _end_block(self) -> None:
        text = self._line()
        if text and self.cells is not None:
            self.cells.append(text)
        elif text:
            self.out.append(text)

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag == "title":
            self.title = []
        if tag in _SKIP and tag not in _VOID:
            self.skip += 1
        if self.skip:
            return
        if tag == "br":
            self.buf.append("\n" if self.pre else " ")
        elif tag in _HEADINGS or tag in _BLOCK or tag == "pre":
            self._end_block()
        elif tag in ("td", "th"):
            self._end_block() if self.cells is None else self.cells.append(self._line())
        elif tag == "img":
            self.buf.append(dict(attrs).get("alt") or "")
        if tag == "tr":
            self.cells = []
        elif tag == "pre":
            self.pre += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "title" and self.title is not None:
            self.page_title, self.title = re.sub(r"\s+", " ", "".join(self.title)).strip(), None
        if tag in _SKIP:
            self.skip = max(self.skip - 1, 0)
            return
        if self.skip:
            return
        if tag in _HEADINGS:
            text = self._line()
            if text:
                self.out.append(Heading(int(tag[1]), text))
        elif tag == "tr" and self.cells is not None:
            self.cells.append(self._line())
            row = " | ".join(c for c in self.cells if c)
            self.cells = None
            if row:
                self.out.append(row)
        elif tag in ("td", "th") and self.cells is not None:
            self.cells.append(self._line())
        elif tag in _BLOCK or tag == "pre":
            self._end_block()
            if tag == "pre":
                self.pre = max(self.pre - 1, 0)

    def handle_data(self, data: str) -> None:
        if self.title is not None:
            self.title.append(data)
        elif not self.skip:
            self.buf.append(data)


def _read(text: str) -> _Reader:
    reader = _Reader()
    reader.feed(text)
    reader.close()
    reader._end_block()
    return reader


def events(text: str) -> Iterator[Event]:
    reader = _read(text)
    heads = [e for e in reader.out if isinstance(e, Heading)]
    top = min((h.level for h in heads), default=0)
    if reader.page_title and not (heads[:1] and heads[0].level == top and sum(h.level == top for h in heads) == 1):
        yield Heading(0, reader.page_title)
    yield from reader.out


def strip_tags(html: str) -> str:
    """The text of an HTML fragment (a raw block in another format), its blocks on their own lines."""
    return "\n".join(e if isinstance(e, str) else e.text for e in _read(html).out)
