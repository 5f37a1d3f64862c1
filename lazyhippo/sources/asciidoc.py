"""AsciiDoc (and the older AsciiDoc Python dialect of man pages) read line by line into headings and text.

Titles are `= Title`, `== Section` or underlined (`=`, `-`, `~`, `^`, `+` for levels 0-4, the underline as long
as the title within two characters). The items of a top-level labelled list (`--depth <depth>::`,
`core.autocrlf::`) are subsections of the section holding the list, so an option or a setting has its own
heading path ("OPTIONS > --depth <depth>"). Listing and literal blocks are kept as code, comments,
passthroughs, attribute entries, anchors and conditionals are dropped, macros keep their text
(`linkgit:git-add[1]` is "git-add(1)").
"""

from __future__ import annotations

import html
import re
from typing import Iterator

from lazyhippo.sources.markup import Close, Event, Heading

_TITLE = re.compile(r"^(={1,6})\s+(\S.*?)(\s+=+)?\s*$")
_UNDERLINE = re.compile(r"^([=\-~^+])\1+\s*$")
_UNDERLINE_LEVEL = {"=": 0, "-": 1, "~": 2, "^": 3, "+": 4}
_DELIMITER = re.compile(r"^(-{4,}|\.{4,}|={4,}|\*{4,}|_{4,}|\+{4,}|/{4,}|--|```.*|\|={3,})\s*$")
_VERBATIM = ("-", ".", "`")   # listing, literal and fenced blocks: code
_DROPPED = ("+", "/")         # passthrough and comment blocks
_ATTRIBUTE = re.compile(r"^:([\w-]+)!?:(?:\s+(.*))?$")
_BLOCK_ATTRIBUTES = re.compile(r"^\[(\[[^\]]*\]|[^\[\]]*)\]\s*$")
_BLOCK_MACRO = re.compile(r"^(include|ifdef|ifndef|ifeval|endif|toc|image|video|audio)::[^\[]*\[.*\]\s*$")
_BLOCK_TITLE = re.compile(r"^\.([^\s.].*)$")
_LABEL = re.compile(r"^(\s*)(\S.*?)(::|;;|:::|::::)(?:\s+(.*))?$")
_ITEM = re.compile(r"^\s*(\*+|-|\.+|\d+\.|[a-z]\.)\s+(\S.*)$")

# AsciiDoc's own character attributes; a document's `:name: value` entries are added to them
_BUILTIN = {"empty": "", "sp": " ", "nbsp": " ", "zwsp": "", "wj": "", "amp": "&", "lt": "<", "gt": ">",
            "brvbar": "¦", "vbar": "|", "startsb": "[", "endsb": "]", "caret": "^", "asterisk": "*", "tilde": "~",
            "plus": "+", "backslash": "\\", "backtick": "`", "apos": "'", "quot": '"', "lsquo": "‘", "rsquo": "’",
            "ldquo": "“", "rdquo": "”", "deg": "°", "hash": "#", "two-colons": "::", "two-semicolons": ";;",
            "cpp": "C++", "pp": "++"}

_PROTECT = re.compile(r"\+\+\+(.+?)\+\+\+|\$\$(.+?)\$\$|pass:[a-z,]*\[(.*?)\]|`\+?(.+?)\+?`")
_MACRO = re.compile(r"(?<![\w:/])([a-z][\w-]*):(?!//?\s)([^\s\[\]]*)\[([^\]]*)\]")
_URL_TEXT = re.compile(r"\b((?:https?|ftp|irc|mailto)://?[^\s\[\]]+)\[([^\]]*)\]")
_XREF = re.compile(r"<<([^<>,]+)(?:,\s*([^<>]+))?>>")
_ANCHOR = re.compile(r"\[\[[^\]]*\]\]|\[#[\w-]+\]")
_INDEX = re.compile(r"\(\(\((.+?)\)\)\)|\(\((.+?)\)\)")
_QUOTES = [re.compile(p) for p in (
    r"(?<![\w*\\])\*\*(?=\S)(.+?)(?<=\S)\*\*", r"(?<![\w_\\])__(?=\S)(.+?)(?<=\S)__",
    r"(?<![\w*\\])\*(?=\S)([^*]+?)(?<=\S)\*(?![\w*])", r"(?<![\w_\\])_(?=\S)([^_]+?)(?<=\S)_(?![\w_])",
    r"(?<![\w'\\])'(?=\S)([^'\n]+?)(?<=\S)'(?![\w'])", r"(?<![\w+\\])\+(?=\S)([^+]+?)(?<=\S)\+(?![\w+])",
    r"(?<![\w#\\])#(?=\S)([^#]+?)(?<=\S)#(?![\w#])")]
_SLOT = re.compile(r"\x00(\d+)\x00")


def inline(text: str, attributes: dict[str, str]) -> str:
    """Quotes, macros, cross references and attribute references as their text; monospace kept as written."""
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    def macro(m: re.Match) -> str:
        name, target, label = m.group(1), m.group(2), m.group(3).strip()
        if re.fullmatch(r"\d\w?", label) and target:  # a manual page reference: linkgit:git-add[1], man:ls[1]
            return keep(f"{target}({label})")
        if name in ("include", "image", "anchor", "indexterm"):
            return label if name == "image" else ""
        return label.split(",")[0].strip('"') or target or ""

    text = re.sub(r"\{([\w-]+)\}", lambda m: attributes.get(m.group(1).lower(), m.group(0)), text)
    text = re.sub(r"``(\S(?:.*?\S)?)''", r'"\1"', text)  # ``double quotes'' of the older dialect
    text = _PROTECT.sub(lambda m: keep(html.unescape(next(g for g in m.groups() if g is not None))), text)
    text = _URL_TEXT.sub(lambda m: m.group(2) or m.group(1), text)
    text = _MACRO.sub(macro, text)
    text = _XREF.sub(lambda m: (m.group(2) or m.group(1)).strip(), text)
    text = _ANCHOR.sub("", text)
    text = _INDEX.sub(lambda m: m.group(2) or "", text)
    for quote in _QUOTES:
        text = quote.sub(r"\1", text)
    text = re.sub(r"\\(?=[\\*_'`+#{<\[\-^~])", "", text)
    text = html.unescape(text)
    return re.sub(r"[ \t]+", " ", _SLOT.sub(lambda m: kept[int(m.group(1))], text)).strip()


class _Reader:
    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.attributes = dict(_BUILTIN)
        self.out: list[Event] = []
        self.para: list[str] = []
        self.verse = False           # the next paragraph keeps its lines ([verse], [literal], [listing])
        self.section_level = 0
        self.in_items = False        # inside a labelled list whose items are subsections
        self.open: list[str] = []    # delimiters of the open compound blocks (example, sidebar, quote, open)

    def text(self, s: str) -> str:
        return inline(s, self.attributes)

    def flush(self) -> None:
        if self.para:
            if self.verse:
                self.out.append("\n".join(self.text(p) for p in self.para))
            else:  # unwrapped, up to a hard line break (a line ending in " +")
                lines: list[str] = []
                for line in self.para:
                    lines.append(line[:-2] + "\n" if line.endswith(" +") else line)
                self.out += [self.text(part) for part in " ".join(lines).split("\n") if part.strip()]
            self.para = []
        self.verse = False

    def heading(self, level: int, title: str) -> None:
        self.flush()
        self.in_items = False
        self.section_level = level
        self.out.append(Heading(level, self.text(title)))

    def is_title(self, i: int) -> int | None:
        """The level of an underlined title whose text is line i, if it is one."""
        if i + 1 >= len(self.lines) or self.para:
            return None
        text, under = self.lines[i].rstrip(), self.lines[i + 1].rstrip()
        m = _UNDERLINE.match(under)
        if not m or not text or not re.match(r"\w", text) or under in self.open or abs(len(under) - len(text)) > 2:
            return None
        return _UNDERLINE_LEVEL[m.group(1)]

    def run(self) -> list[Event]:
        lines, i, n = self.lines, 0, len(self.lines)
        after_blank = True
        while i < n:
            line = lines[i]
            s = line.strip()
            if not s:
                self.flush()
                after_blank = True
                i += 1
                continue
            blank_before = after_blank  # lines that are not text (comments, attributes, macros) leave it as it is
            delimiter = _DELIMITER.match(s)
            level = self.is_title(i) if not line[0].isspace() else None
            if level is not None:
                self.heading(level, s)
                i += 2
                continue
            if s.startswith("//") and not s.startswith("////"):
                i += 1
                continue
            attribute = _ATTRIBUTE.match(line)
            if attribute and not self.para:
                self.attributes[attribute.group(1).lower()] = attribute.group(2) or ""
                i += 1
                continue
            if _BLOCK_MACRO.match(s):
                i += 1
                continue
            block = _BLOCK_ATTRIBUTES.match(s)
            if block and not self.para:
                style = block.group(1).split(",")[0].strip().lower()
                self.flush()
                self.verse = style in ("verse", "literal", "listing", "source")
                i += 1
                continue
            after_blank = False
            if delimiter:
                i = self.delimited(i, s)
                continue
            if title := _TITLE.match(line):
                self.heading(len(title.group(1)) - 1, title.group(2))
                i += 1
                continue
            if s == "+":  # a list continuation: what follows belongs to the item
                self.flush()
                i += 1
                continue
            label = _LABEL.match(line)
            if label and not self.verse and not label.group(2).startswith(("//", "http")):
                i = self.labelled(i, label)
                continue
            if blank_before and self.in_items and not line[0].isspace() and not _ITEM.match(line) \
                    and not _BLOCK_TITLE.match(s):
                self.flush()  # a paragraph after the list: back in the section holding the list
                self.in_items = False
                self.out.append(Close(self.section_level + 1))
            if (item := _ITEM.match(line)) and not self.verse:
                self.flush()
                self.para = [item.group(2)]
            elif (bt := _BLOCK_TITLE.match(s)) and not self.para:
                self.out.append(self.text(bt.group(1)))
            elif blank_before and line[0].isspace() and not self.para and not self.in_items:
                j = i  # an indented paragraph is literal text
                while j < n and lines[j].strip():
                    j += 1
                self.out.append(_dedent(lines[i:j]))
                i = j
                continue
            else:
                self.para.append(s if not self.verse else line.rstrip())
            i += 1
        self.flush()
        return self.out

    def delimited(self, i: int, s: str) -> int:
        """Handle the block delimited by line i; return the line after what was consumed."""
        self.flush()
        if self.open and self.open[-1] == s:  # the end of a compound block
            self.open.pop()
            return i + 1
        char = s[0]
        if char in _VERBATIM or char in _DROPPED or s.startswith("|="):
            end = next((j for j in range(i + 1, len(self.lines)) if self.lines[j].rstrip() == s.rstrip()
                        or (s.startswith("```") and self.lines[j].strip() == "```")), len(self.lines))
            body = self.lines[i + 1:end]
            if s.startswith("|="):
                self.out += [r for r in (self.row(line) for line in body) if r]
            elif char in _VERBATIM:
                code = _dedent(body)
                if code:
                    self.out.append(code)
            return end + 1
        self.open.append(s)  # example, sidebar, quote and open blocks: their content is read as usual
        return i + 1

    def row(self, line: str) -> str:
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)]
        cells = [re.sub(r"^(\d+\+|\d*\.?\d*[a-z]?)$", "", c) for c in cells]
        return " | ".join(self.text(c) for c in cells if c)

    def labelled(self, i: int, label: re.Match) -> int:
        """One item of a labelled list: its terms (consecutive term lines) and the text after them. Items of a
        list at the start of a line with `::` are subsections; others are a line of text."""
        lines, terms, j = self.lines, [label.group(2)], i + 1
        text = label.group(4)
        while not text and j < len(lines) and (more := _LABEL.match(lines[j])) and more.group(3) == label.group(3):
            terms.append(more.group(2))
            text = more.group(4)
            j += 1
        self.flush()
        name = ", ".join(self.text(t) for t in terms)
        if label.group(3) == "::" and not label.group(1) and not self.open:
            self.out.append(Heading(self.section_level + 1, name, item=True))
            self.in_items = True
        else:
            self.out.append(name)
        if text:
            self.para = [text]
        return j


def _dedent(lines: list[str]) -> str:
    lines = [line.expandtabs(8).rstrip() for line in lines]
    depth = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[depth:] for line in lines).strip("\n")


def events(text: str) -> Iterator[Event]:
    yield from _Reader(text.splitlines()).run()
