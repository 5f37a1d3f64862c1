"""Marked-up documents (Markdown, reStructuredText, AsciiDoc, HTML) read as documents: each format's reader
turns its markup into a stream of headings and plain-text blocks, and `outline` turns that stream into the
document's title and its sections, each under its heading path ("OPTIONS > --depth").

A block is one unit of text: a paragraph unwrapped to one line, a list item, a table row, or a code block with
its lines kept. Chunks keep each line of a marked-up document on its own line (see `stages/chunks.py`), so a
heading never runs into the sentence after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

PATH_SEP = " > "


@dataclass(frozen=True)
class Heading:
    level: int  # smaller is higher; only the order matters
    text: str
    item: bool = False  # a labelled list item read as a subsection: never the document's title


@dataclass(frozen=True)
class Close:
    """The text after this belongs to the heading above `level` again (the end of a labelled list whose
    items were subsections)."""
    level: int


Event = Heading | Close | str


def outline(events: Iterable[Event]) -> tuple[str | None, list[tuple[str | None, str]]]:
    """The title (the first heading) and the sections as (heading path, text). A title alone at the top level
    is the document's name and stays out of the heading paths; text before the first subsection is under it."""
    events = [e for e in events if not isinstance(e, str) or e.strip()]
    heads = [e for e in events if isinstance(e, Heading)]
    titles = [h for h in heads if not h.item]
    top = min((h.level for h in heads), default=0)
    doc_title = titles[0] if titles and titles[0] is heads[0] and sum(h.level == top for h in heads) == 1 else None
    sections: list[tuple[str | None, str]] = []
    path: list[Heading] = []
    carried: list[str] = []  # heading lines of sections without text of their own, put before their first subsection
    lines: list[str] = []

    def name() -> str | None:
        names = [h.text for h in path if h is not doc_title]
        return PATH_SEP.join(names) if names else (doc_title.text if doc_title else None)

    def flush(nxt: Event | None) -> None:
        nonlocal carried
        heading_lines = sum(1 for line in lines if isinstance(line, Heading))
        text = [line.text if isinstance(line, Heading) else line for line in lines]
        if len(text) > heading_lines:
            sections.append((name(), "\n".join(carried + text)))
            carried = []
        elif text and isinstance(nxt, Heading) and path and nxt.level > path[-1].level:
            carried += text  # a heading followed directly by its first subsection
        else:
            carried = []
        lines.clear()

    for e in events:
        if isinstance(e, str):
            lines.append(e)
            continue
        flush(e)
        while path and path[-1].level >= e.level:
            path.pop()
        if isinstance(e, Heading):
            path.append(e)
            lines.append(e)
    flush(None)
    return (titles[0].text if titles else None), sections


def pretty_name(file_name: str) -> str:
    """A title from a file name, for documents without a heading: document extensions go ("index.rst.txt"
    is "Index") and an all-lower-case name gets capitals."""
    stem = file_name
    while True:
        base, dot, ext = stem.rpartition(".")
        if not dot or not base or "." + ext.lower() not in DOCUMENT_SUFFIXES:
            break
        stem = base
    words = re.sub(r"[_\s]+", " ", stem).strip()
    return " ".join(w[:1].upper() + w[1:] for w in words.split()) if words.islower() else words


DOCUMENT_SUFFIXES = {".txt", ".text", ".md", ".markdown", ".rst", ".rest", ".adoc", ".asciidoc", ".html", ".htm"}
FORMAT_BY_SUFFIX = {".md": "md", ".markdown": "md", ".rst": "rst", ".rest": "rst", ".adoc": "adoc",
                    ".asciidoc": "adoc", ".html": "html", ".htm": "html"}

# Signs of a format in text without a telling extension, each with a weight (at most three of a kind count); a
# format needs 2 points. reST and AsciiDoc share underlined titles, so the signs only one of them has decide.
_REST_SIGNS = [
    (re.compile(r"^\.\. [\w:-]+::(\s|$)", re.M), 3),          # a directive
    (re.compile(r"^\.\. _[^:\n]+:", re.M), 2),                # a target
    (re.compile(r"^([=\-~^\"'`#*+])\1{2,}\n[^\n]+\n\1{3,}$", re.M), 1),  # an overlined title (or a one-line block)
    (re.compile(r":[\w:-]+:`[^`\n]+`"), 1),                   # a role
    (re.compile(r"``[^`\n]+``"), 1),                          # an inline literal
]
_ADOC_SIGNS = [
    (re.compile(r"\A\s*(//[^\n]*\n\s*)*= \S"), 3),            # a `= Title` first line
    (re.compile(r"^={2,6} \S", re.M), 2),                     # a section title
    (re.compile(r"^\[\[[\w:.-]+(,[^\]]*)?\]\]$", re.M), 2),   # a block anchor
    (re.compile(r"^(include|ifdef|ifndef|endif|image)::\S*\[[^\]]*\]$", re.M), 3),  # a block macro
    (re.compile(r"^\[(verse|source|listing|literal|quote|NOTE|TIP|WARNING|IMPORTANT|CAUTION)[,\]]", re.M), 2),
    (re.compile(r"^:[\w-]+:( .*)?$", re.M), 1),                # an attribute entry
    (re.compile(r"^\+$", re.M), 1),                           # a list continuation
    (re.compile(r"\n\n(-{4,})\n.*?\n\1$", re.M | re.S), 1),   # a listing block
    (re.compile(r"\b[a-z]+:[\w./-]+\[[^\]\n]*\]"), 1),        # an inline macro (link:, linkgit:, ...)
    (re.compile(r"^\S[^\n]*?(::|;;)([ \t]+\S[^\n]*)?\n", re.M), 1),  # a labelled list item
    (re.compile(r"^Content-type: text/asciidoc$", re.M | re.I), 3),  # a mail-form document's own header
]
_UNDERLINED = re.compile(r"^(\w[^\n]*)\n([=\-~^+])\2{2,}$", re.M)


def sniff(text: str) -> str | None:
    """'rst' or 'adoc' when plain text is really marked up, else None."""
    sample = text[:200_000]
    rest = sum(w * min(len(p.findall(sample)), 3) for p, w in _REST_SIGNS)
    adoc = sum(w * min(len(p.findall(sample)), 3) for p, w in _ADOC_SIGNS)
    titles = [m for m in _UNDERLINED.finditer(sample) if abs(len(m.group(0).split("\n")[1]) - len(m.group(1))) <= 2]
    underlined = 2 * min(len(titles), 3)
    if max(rest, adoc) + underlined < 2:
        return None
    return "rst" if rest > adoc else "adoc"  # underlined titles alone read the same either way
