"""Names in technical text that a news-trained NER model misses or cuts apart: code identifiers (`pkg.module.func`,
`fetch_pack_args`, `ArgumentParser`, `func()`), command-line options (`--depth`, `-B`), configuration keys
(`core.autocrlf`, `remote.<name>.url`), manual pages (`git-fetch(1)`), commands (`git rebase`) and headings.

Commands are found without a list of programs: a word is a command when the chunk's title or text names its
manual pages (`git-rebase(1)` makes `git` one) or runs it at a shell prompt (`$ git ...`), and its subcommand
is the next word when that is no stop word and no finite verb ("git stores" is a sentence, "git rebase" a command).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PART = r"(?:[A-Za-z_]\w*|<[\w-]+>)"
_PATTERNS = [
    ("COMMAND", re.compile(r"(?<![\w./-])[a-z][\w.+-]*\(\d[a-z]?\)")),                        # git-fetch(1)
    ("OPTION", re.compile(r"(?<![\w/\\.-])(?:--[A-Za-z][\w-]*[A-Za-z0-9]|-[A-Za-z])(?![\w-])")),  # --depth, -B
    ("CODE", re.compile(rf"(?<![\w./$-])(?:[A-Za-z_]\w+|<[\w-]+>)(?:\.{_PART})*\.(?:[A-Za-z_]\w+|<[\w-]+>)"
                        r"(?:\(\))?(?![\w/-]|\.\w)")),                                          # core.autocrlf
    ("CODE", re.compile(r"(?<![\w.])[A-Za-z_]\w*\(\)")),                                      # func()
    ("CODE", re.compile(r"(?<![\w.-])_*[A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+_*(?![\w-])")),  # snake_case, GIT_DIR
    # rejectShallow, ArgumentParser; a capital after two letters starts a name as often ("McKee", "DeVito")
    ("CAMEL", re.compile(r"(?<![\w.-])(?:[a-z]+|[A-Z][a-z0-9]{2,})(?:[A-Z][a-z0-9]+)+(?![\w-])")),
]
_PROGRAM = re.compile(r"(?<![\w./-])([a-z][\w]*)-[a-z][\w-]*\(\d[a-z]?\)|^\$ ([a-z][\w.-]*)\b", re.M)
_FINITE = {"VBZ", "VBD", "MD", "VBN"}


@dataclass(frozen=True)
class Span:
    text: str
    label: str
    start: int
    end: int

    def inside(self, other: "Span") -> bool:
        return other.start <= self.start and self.end <= other.end

    def overlaps(self, other: "Span") -> bool:
        return self.start < other.end and other.start < self.end


def technical_spans(text: str, title: str, doc) -> list[Span]:
    """Identifiers, options, keys, manual pages and commands in `text` (`doc` is its spaCy parse), none inside
    another; a CamelCase word a named entity holds is (part of) a name ("Lucky McKee"), not code."""
    found: list[Span] = []
    for label, pattern in _PATTERNS:
        for m in pattern.finditer(text):
            span = Span(m.group(0), "CODE" if label == "CAMEL" else label, m.start(), m.end())
            if label == "CODE" and re.fullmatch(r"\w{1,2}(\.\w{1,2})+", span.text):
                continue  # initials and abbreviations: "e.g", "U.S"
            if label == "CAMEL" and any(e.start_char <= span.start and span.end <= e.end_char for e in doc.ents):
                continue
            found.append(span)
    found += _commands(text, title, doc)
    found.sort(key=lambda s: (s.start, -(s.end - s.start)))
    kept: list[Span] = []
    for span in found:  # the longest of overlapping spans wins
        if not any(span.overlaps(k) for k in kept):
            kept.append(span)
    return kept


def _commands(text: str, title: str, doc) -> list[Span]:
    programs = {m.group(1) or m.group(2) for m in _PROGRAM.finditer(f"{title}\n{text}")}
    if not programs:
        return []
    out = []
    names = "|".join(map(re.escape, sorted(programs)))
    for m in re.finditer(rf"(?<![\w/.-])({names}) ([a-z][a-z0-9-]*[a-z0-9])(?![\w(-])", text):
        sub = doc.char_span(m.start(2), m.end(2), alignment_mode="expand")
        if sub is not None and len(sub) and not sub[0].is_stop and sub[0].tag_ not in _FINITE:
            out.append(Span(m.group(0), "COMMAND", m.start(), m.end()))
    return out


def heading_spans(text: str, section: str | None, doc) -> tuple[list[Span], list[Span]]:
    """The chunk's heading lines (the components of its heading path that stand on a line of their own), and
    those that are entities: a heading naming something (two words that are not stop words, or a proper name),
    not one that only names a part of a document ("OPTIONS", "See also")."""
    if not section:
        return [], []
    lines, named = [], []
    for heading in set(section.split(" > ")):
        for m in re.finditer(rf"^{re.escape(heading)}$", text, re.M):
            span = Span(heading, "HEADING", m.start(), m.end())
            lines.append(span)
            words = [t for t in (doc.char_span(m.start(), m.end(), alignment_mode="expand") or [])
                     if not t.is_punct and not t.is_space]
            content = [t for t in words if not t.is_stop]
            if len(content) >= 2 or (len(words) == 1 and content and content[0].pos_ == "PROPN"
                                     and not heading.isupper()):
                named.append(span)
    return lines, named
