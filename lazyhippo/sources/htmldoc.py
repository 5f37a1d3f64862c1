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
# A site's chrome around the page's text: what ARIA roles or class and id words name as navigation, menus, tables
# of contents and breadcrumbs. Only elements that always close are skipped, so an unclosed one cannot hide the page.
_CHROME_ROLES = {"navigation", "banner", "search", "contentinfo"}
_CHROME_WORDS = {"nav", "navbar", "navigation", "menu", "mainmenu", "submenu", "toc", "breadcrumb", "breadcrumbs"}
_CLOSED = {"div", "ul", "ol", "section", "aside", "header", "footer", "table"}


def _chrome(tag: str, attrs) -> bool:
    if tag not in _CLOSED:
        return False
    a = dict(attrs)
    words = set(re.split(r"[^a-z0-9]+", f"{a.get('class') or ''} {a.get('id') or ''}".lower()))
    return (a.get("role") or "").lower() in _CHROME_ROLES or not words.isdisjoint(_CHROME_WORDS)


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
        self.chrome: list = []  # the skipped chrome element's tag and how deep inside it its own tag is open
        self.keep_chrome = False

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
        if self.chrome and tag == self.chrome[0]:
            self.chrome[1] += 1
        elif not self.skip and not self.keep_chrome and _chrome(tag, attrs):
            self.chrome = [tag, 1]
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
        if self.chrome and tag == self.chrome[0]:
            self.chrome[1] -= 1
            if not self.chrome[1]:
                self.chrome, self.skip = [], max(self.skip - 1, 0)
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
    """The page read without its chrome; read again with it when that left no text (a page that is all
    navigation, or markup that never closed the element)."""
    for keep in (False, True):
        reader = _Reader()
        reader.keep_chrome = keep
        reader.feed(text)
        reader.close()
        reader._end_block()
        if any(isinstance(e, str) for e in reader.out):
            break
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
