"""Text helpers shared by the query engine: name normalization, tokens, stopwords, sentences."""

from __future__ import annotations

import re
import threading

import Stemmer

from lazyhippo.graph.names import name_tokens, norm_key, strip_accents  # noqa: F401  (re-exported for the query engine)
from lazyhippo.models.tokens import sentences  # noqa: F401  (re-exported for the query engine)

# English function words plus the question words that never name anything.
STOPWORDS = frozenset("""
a an and are as at be been being but by can could did do does doing done for from had has have having he her
hers him his how i if in into is it its itself me more most my no nor not of off on once only or other our ours
out over own same she should so some such than that the their theirs them then there these they this those
through to too under until up very was we were what when where which while who whom whose why will with would
you your yours also about after again against all am any because before below between both during each few
further here just s t don now ll re ve d m o y ain
""".split())
QUESTION_WORDS = frozenset("who whom whose what when where which why how".split())

_WORD = re.compile(r"[^\W_]+")


def fold(text: str) -> str:
    """Lower case without accents (NFKD, combining marks dropped)."""
    return strip_accents(text).lower()


def tokens(text: str) -> list[str]:
    """Folded word tokens (for BM25 and keyword overlap), stopwords and 1-char tokens removed."""
    return [t for t in _WORD.findall(fold(text)) if len(t) > 1 and t not in STOPWORDS]


_STEMMER = threading.local()  # a Snowball stemmer is not safe to share between threads


def stems(words) -> list[str]:
    """The English (Snowball) stem of each folded token, so that a question and a passage match across
    inflections: "carries" and "carry", "runs" and "running", "decided" and "decide"."""
    stemmer = getattr(_STEMMER, "english", None)
    if stemmer is None:
        stemmer = _STEMMER.english = Stemmer.Stemmer("english")
    return stemmer.stemWords(words)


_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)  # `code` (Markdown, AsciiDoc) or ``code`` (reST), closed by as many


def code_tokens(text: str) -> list[bool]:
    """Per name token of `text` (`name_tokens`), whether it stands inside a code span (between backticks):
    an identifier, option or command the question names as written, whatever its case. An unmatched backtick
    opens no span."""
    flags, end = [], 0
    for m in _CODE_SPAN.finditer(text):
        flags += [False] * len(name_tokens(text[end:m.start()])) + [True] * len(name_tokens(m.group(2)))
        end = m.end()
    return flags + [False] * len(name_tokens(text[end:]))


_HEADING = re.compile(r"^\s*#{1,6}\s+")


def strip_heading(text: str) -> str:
    return _HEADING.sub("", text)


# Markup left in a passage (Markdown, AsciiDoc, reStructuredText, a few HTML tags) that an answer must not show.
# Lines that are markup only: block delimiters and title underlines, attribute and block-option lines, anchors,
# comments, directives, includes, table rules.
_MARKUP_LINE = re.compile(
    r"^\s*(?:[-=~^+*_.#/`]{3,}\s*|\[\[?[^\]]*\]\]?\s*|:[\w-]+:(?:\s.*)?|//.*|\.\.\s*(?:[\w:-]+::.*|_[^:]+:.*)?|"
    r"(?:include|ifdef|ifndef|ifeval|endif|image|toc)::\S*\[[^\]]*\]|\|?\s*:?-{3,}:?\s*(?:\|\s*:?-{3,}:?\s*)*\|?|\+|--|"
    r"\.[A-Z].*)$")  # ... an AsciiDoc open block (--) and block title (.Title)
_FENCE = re.compile(r"^\s*(?:```|~~~|-{4,}|\.{4,})\s*\w*\s*$")       # code fences, AsciiDoc listing/literal blocks
_HEADING_LINE = re.compile(r"^\s*(?:#{1,6}|={1,6})\s+\S")           # Markdown and AsciiDoc section titles
_ITEM = re.compile(r"^\s*(?:[-*+•]|\*{1,5}|\.{1,5}|\d+[.)]|[a-z][.)])\s+")  # list markers
_DEF_TERM = re.compile(r"^(\S.*?)(?::{2,4}|;;)(?:\s+|$)")           # AsciiDoc definition list `term::`
_ATTRIBUTES = {"asterisk": "*", "litdd": "--", "caret": "^", "plus": "+", "tilde": "~", "startsb": "[",
               "endsb": "]", "vbar": "|", "nbsp": " ", "empty": "", "apos": "'", "quot": '"', "amp": "&",
               "lt": "<", "gt": ">", "sp": " ", "two-colons": "::", "two-semicolons": ";;", "cpp": "C++"}
_INLINE = [  # (pattern, replacement), in order: links before emphasis, code before quotes
    (re.compile(r"<!--.*?-->", re.S), ""),
    (re.compile(r"\(\(\(.*?\)\)\)"), ""),                                   # AsciiDoc index terms
    (re.compile(r"\b(?:ifdef|ifndef|ifeval|endif|include)::[^\s\[]*\[[^\]]*\]"), ""),  # AsciiDoc conditionals
    (re.compile(r"\[\[[^\]]*\]\]|\[\^[^\]]*\]|\banchor:[\w-]+\[[^\]]*\]"), ""),  # anchors, footnote marks
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),                         # Markdown image
    (re.compile(r"\[([^\]]+)\]\([^)]*\)|\[([^\]]+)\]\[[^\]]*\]"), r"\1\2"),  # Markdown links
    (re.compile(r"`([^`<]+?)\s*<[^>]+>`__?"), r"\1"),                       # reST `text <url>`_
    (re.compile(r":[\w:.+-]+:`([^`<]*?)(?:\s*<[^>]+>)?`"), r"\1"),          # reST roles :role:`text`
    (re.compile(r"\blinkgit:([\w.-]+)\[(\d)\]"), r"\1(\2)"),                # git's man page links
    (re.compile(r"\b(?:https?|ftp|mailto|link|xref|footnote|kbd|btn|menu|pass|footnoteref):"
                r"([^\s\[]*)\[([^\]]*)\]"), lambda m: m.group(2) or m.group(1)),  # AsciiDoc macros
    (re.compile(r"<<[\w:.-]+,\s*([^>]+)>>|<<([\w:.-]+)>>"), r"\1\2"),        # AsciiDoc cross references
    (re.compile(r"\{([\w-]+)\}"), lambda m: _ATTRIBUTES.get(m.group(1), m.group(1))),
    (re.compile(r"</?(?:br|p|div|span|b|i|em|strong|code|pre|a|img|sup|sub|ul|ol|li|table|tr|td|th|h[1-6]|kbd|tt|"
                r"u|s|small|hr|blockquote)\b[^>]*>", re.I), " "),
    (re.compile(r"\+\+\+(.+?)\+\+\+"), r"\1"),
    (re.compile(r"``+\+?(.+?)\+?``+|`\+?([^`]+?)\+?`"), r"\1\2"),            # code spans (also `+text+`)
    (re.compile(r"`([\w_]+)`_{1,2}(?!\w)"), r"\1"),                          # reST `ref`_
    (re.compile(r"(?<![\w*\\])(\*\*|__)(?=\S)(.+?)(?<=\S)\1(?![\w*])"), r"\2"),  # strong
    (re.compile(r"(?<![\w*\\])([*_])(?=[^\s*_])(.+?)(?<=[^\s*_])\1(?![\w*])"), r"\2"),  # emphasis
    (re.compile(r"(?<![\w'])'(?=[^\s'])([^'\n]{1,80}?)(?<=[^\s'])'(?![\w'])"), r"\1"),  # AsciiDoc 'emphasis'
    (re.compile(r"(?<![\w+])\+(?=\S)([^+\n]{1,80}?)(?<=\S)\+(?![\w+])"), r"\1"),  # AsciiDoc +literal+
    (re.compile(r"(?<=\S):{2,4}(?=\s|$)"), ":"),              # reST literal-block colons, inline definition terms
    (re.compile(r"\\([\\`*_{}\[\]()#+.!|-])"), r"\1"),                       # escapes
]


_LINE_EDGES = re.compile(r"^>\s?|\s\+$")  # a blockquote mark, an AsciiDoc hard line break
_LEFTOVER = re.compile(r"`|\*\*")  # what an unmatched code span or emphasis leaves behind


def strip_markup(text: str) -> str:
    """Text without its inline markup (`_INLINE` in order, then unmatched marks)."""
    for pattern, repl in _INLINE:
        text = pattern.sub(repl, text)
    return _LEFTOVER.sub("", text).strip()


# Block delimiters and title underlines that a chunker ran into the prose around them ("... manner. Bisect skip
# ~~~~~~~~~~~ Instead of ..."): an underline takes the short title before it along.
_RUN_TITLE = re.compile(r"(?:(?<=[.!?:])|^)[ \t]*[^.!?:\n]{1,60}?[ \t]+([=\-~^+*])\1{3,}(?=[ \t]|$)", re.M)
_RUN = re.compile(r"(?:(?<=\S)[ \t]+([=\-~^+*_.])\1{3,}(?=[ \t]|$))|(?:^([=\-~^+*_.])\2{3,}[ \t]+(?=\S))", re.M)
_COMMAND = re.compile(r"^\$ ")  # a shell command line, not prose
# A line of code that a reader kept without its block's fences. C-family: it ends a statement or a block and holds a
# call, a brace or an assignment ("const file = await open(path);", "for (const x of y) {"), or closes a block
# ("})();"); a wrapped line of prose ending in ";" has no call: "... (the default);". Python: a decorator, a
# definition, an import, a return, assert or raise, a lower-case compound statement's head ("for x in y:"), an
# assignment ("runner = CliRunner()"; also a config file's "url = ..."), a call alone on its line ("click.echo(x)"),
# a doctest prompt.
_CODE_LINE = re.compile(r"^(?=.*(?:\w\(|[{}=])).*[;{}]$|^[})\]]"
                        r"|^(?:@[\w.]+|def \w+\(|class \w+[(:]|(?:from [\w.]+ )?import [\w.]+"
                        r"|(?:return|assert|raise)\b|>>> )"
                        r"|^(?:if|elif|else|for|while|with|try|except|finally)\b.*:$"
                        r"|^[\w.]+(?:\[[^\]]*\])? = \S|^[\w.]+\(.*\)$")


def _split_runs(text: str) -> str:
    return _RUN.sub("\n\n", _RUN_TITLE.sub("\n\n", text))


def paragraphs(text: str) -> list[str]:
    """The prose paragraphs of a passage with its markup removed and wrapped lines joined: headings (also
    underlined ones), code and literal blocks and markup-only lines are dropped; a list item or a definition
    (`term::` lines, then their text: "-q, --quiet: text") starts a paragraph of its own, and so do lines of code
    a reader kept without their fences (`_CODE_LINE`), as they are written: markup rules would eat their quotes."""
    out: list[str] = []
    current: list[str] = []
    code: list[str] = []      # lines of code in a row
    terms: list[str] = []     # definition terms waiting for their text
    fence, previous, literal = None, "", False

    def close() -> None:
        if current:
            out.append(strip_markup(" ".join(current)))
            current.clear()

    for raw in _split_runs(text).splitlines():
        line, above = raw.strip(), previous
        previous = line
        if fence is None and line and not raw.startswith((" ", "\t")) and _CODE_LINE.match(line):  # indented: literal
            close()
            code.append(line)
            continue
        if code:
            out.append(" ".join(code))
            code.clear()
        if fence is not None:
            if line.startswith(fence) and set(line) <= set(fence[0]):
                fence = None
            continue
        if set(line) <= set("=-~^+*") and line and above and abs(len(line) - len(above)) <= 2:
            if current:
                current.pop()  # the title this line underlines
            close()
            continue
        if _FENCE.match(line):
            close()
            fence = line[:3] if line.startswith(("`", "~")) else line
            continue
        indented = raw.startswith(("\t", "  ")) and not _ITEM.match(line)
        literal = literal or (indented and not current and not terms and not above)
        if not line or not indented:
            literal = False
        if not line or literal or _MARKUP_LINE.match(line) or _HEADING_LINE.match(line) or _COMMAND.match(line):
            close()  # a blank line, a literal (indented) paragraph, markup only, a heading
            continue
        if _ITEM.match(line):
            close()
            line = _ITEM.sub("", line, count=1)
        term = _DEF_TERM.match(line)
        if term and not re.match(r"\w+://", line):
            close()
            terms.append(strip_markup(term.group(1)))
            line = line[term.end():].strip()
            if not line:
                continue
        if line.startswith("|"):
            line = ", ".join(cell.strip() for cell in line.strip("|").split("|"))
        line = _LINE_EDGES.sub("", line)
        if terms and line:
            line, terms = f"{', '.join(terms)}: {line}", []
        if line:
            current.append(line)
    close()
    out.append(" ".join(code))
    return [p for p in (re.sub(r"\s+", " ", p).strip() for p in out) if p]


def prose_sentences(text: str) -> list[str]:
    """The sentences of a passage as a reader should see them: markup removed, wrapped lines joined."""
    return [s for p in paragraphs(text) for s in sentences(p)]
