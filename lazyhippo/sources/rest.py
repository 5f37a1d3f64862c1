"""reStructuredText (with Sphinx's roles and directives) read line by line into headings and plain text.

Docutils would need every Sphinx role and directive registered and turns the unknown ones into error nodes;
for text what matters is the outline, prose and code: titles (their levels in the order their adornment
styles first appear), paragraphs unwrapped, literal and code blocks kept, roles and references as their text,
directives kept where their body is prose (note, warning, versionchanged, a function's description) and
dropped where they are markup (toctree, include, comments, targets, options).
"""

from __future__ import annotations

import re
from typing import Iterator

from lazyhippo.sources.markup import Event, Heading

_ADORN = re.compile(r"^([!-/:-@\[-`{-~])\1{2,}\s*$")
_DIRECTIVE = re.compile(r"^\s*\.\.\s+([\w:.+-]+?)::(?:\s+(.*))?$")
_FOOTNOTE = re.compile(r"^\s*\.\.\s+\[[^\]]+\]\s*(.*)$")
_ITEM = re.compile(r"^(\s*)([-*+•‣⁃]|\d+[.)]|#\.|\(\d+\))(\s+)(\S.*)$")
_FIELD = re.compile(r"^(\s*):([^:`\s][^:`]*?):(\s+(\S.*))?$")
_OPTION = re.compile(r"^\s*:[\w-]+:(\s.*)?$")
_TABLE_BORDER = re.compile(r"^\s*(\+([-=+:]+\+)+|=+( +=+)+)\s*$")
_GRID_ROW = re.compile(r"^\s*\|.*\|\s*$")
_LINE_BLOCK = re.compile(r"^\s*\| (.*)$")

_CODE = {"code", "code-block", "sourcecode", "doctest", "testcode", "testoutput", "parsed-literal",
         "productionlist", "math", "prompt"}
_MARKUP_ONLY = {"toctree", "include", "literalinclude", "image", "raw", "index", "meta", "contents", "sectnum",
                "section-numbering", "highlight", "currentmodule", "module", "default-role", "default-domain",
                "role", "title", "tabularcolumns", "testsetup", "testcleanup", "program", "sectionauthor",
                "moduleauthor", "codeauthor", "target-notes", "header", "footer", "class", "unicode", "date",
                "replace", "graphviz", "digraph", "graph", "inheritance-diagram", "highlightlang", "cssclass",
                "rst-class"}
_ARGS_NOT_TEXT = {"figure", "only", "ifconfig", "container", "hlist", "glossary"}
_LABELS = {"versionadded": "New in version {}", "versionchanged": "Changed in version {}",
           "deprecated": "Deprecated since version {}", "versionremoved": "Removed in version {}",
           "seealso": "See also", "note": "Note", "warning": "Warning", "tip": "Tip", "important": "Important",
           "caution": "Caution", "attention": "Attention", "danger": "Danger", "error": "Error", "hint": "Hint",
           "todo": "To do"}

_LITERAL = re.compile(r"``(\S(?:.*?\S)?)``")
_ROLE = re.compile(r":(?:[\w.+-]+:)+`((?:\\`|[^`])+)`|`((?:\\`|[^`])+)`:(?:[\w.+-]+:)+")
_REFERENCE = re.compile(r"`([^`<]*?)\s*<([^<>`]+)>`__?")
_INTERPRETED = re.compile(r"_?`([^`]+)`(?:__?)?")
_FOOTNOTE_REF = re.compile(r"\s?\[(?:\d+|#[\w-]*|\*|[A-Za-z][\w.-]*)\]_")
_EMPHASIS = re.compile(r"(?<![\w*\\])(\*\*?)(?=\S)(.+?)(?<=\S)\1(?![\w*])")
_SUBSTITUTION = re.compile(r"(?<![\w|])\|(\S[^|]*?)\|(?:__?)?(?![\w|])")
_NAME_REF = re.compile(r"\b([A-Za-z0-9][\w.-]*?[A-Za-z0-9])__?(?=[\s.,;:!?)\]]|$)")
_SLOT = re.compile(r"\x00(\d+)\x00")
_REPLACE = re.compile(r"^\.\.\s+\|([^|]+)\|\s+replace::\s+(.*)$", re.M)


def inline(text: str, substitutions: dict[str, str] | None = None) -> str:
    """Roles, references, literals, emphasis and substitutions (`|name|`, replaced where defined) as their text."""
    kept: list[str] = []

    def keep(value: str) -> str:
        kept.append(value)
        return f"\x00{len(kept) - 1}\x00"

    def role(m: re.Match) -> str:
        content = (m.group(1) or m.group(2)).replace("\\`", "`")
        title = re.match(r"(.*?)\s*<[^<>]+>$", content, re.S)
        content = title.group(1) if title and title.group(1) else content
        return keep(content.lstrip("~!"))

    text = _LITERAL.sub(lambda m: keep(m.group(1)), text)
    text = _ROLE.sub(role, text)
    text = _REFERENCE.sub(lambda m: keep(m.group(1) or m.group(2)), text)
    text = _INTERPRETED.sub(lambda m: keep(m.group(1)), text)
    text = _FOOTNOTE_REF.sub("", text)
    text = _EMPHASIS.sub(r"\2", text)
    text = _SUBSTITUTION.sub(lambda m: (substitutions or {}).get(m.group(1), m.group(1)), text)
    text = _NAME_REF.sub(r"\1", text)
    text = re.sub(r"\\(.)", r"\1", text.replace("\\ ", ""))
    return _SLOT.sub(lambda m: kept[int(m.group(1))], text).strip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _dedent(lines: list[str]) -> list[str]:
    depth = min((_indent(line) for line in lines if line.strip()), default=0)
    return [line[depth:] for line in lines]


def _block_end(lines: list[str], i: int, indent: int) -> int:
    """The end of the block starting at line i: it holds the lines indented deeper than `indent` (and blanks)."""
    j = i
    while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > indent):
        j += 1
    while j > i and not lines[j - 1].strip():
        j -= 1
    return j


class _Reader:
    def __init__(self, text: str) -> None:
        self.styles: list[tuple[str, bool]] = []  # adornment styles, in the order of their levels
        self.substitutions = {m.group(1): inline(m.group(2)) for m in _REPLACE.finditer(text)}

    def inline(self, text: str) -> str:
        return inline(text, self.substitutions)

    def _level(self, char: str, overline: bool) -> int:
        if (char, overline) not in self.styles:
            self.styles.append((char, overline))
        return self.styles.index((char, overline)) + 1

    def blocks(self, lines: list[str], headings: bool = True) -> list[Event]:
        out: list[Event] = []
        para: list[str] = []
        para_indent = text_indent = 0
        item = False           # the paragraph is a list item or field: deeper lines continue it
        literal_after = None   # indentation of a paragraph ending in "::": a deeper block after it is code
        table = False
        i, n = 0, len(lines)

        def flush() -> None:
            nonlocal literal_after
            if not para:
                return
            text = " ".join(para)
            if text.endswith("::"):
                literal_after = para_indent
                text = text[:-2].rstrip() if text[:-2].endswith((" ", "\t")) or text == "::" else text[:-1]
            if text.strip():
                out.append(self.inline(text))
            para.clear()

        while i < n:
            line = lines[i]
            s, ind = line.strip(), _indent(line)
            if not s:
                flush()
                table = False
                i += 1
                continue
            if literal_after is not None and not para and ind > literal_after:
                j = _block_end(lines, i, literal_after)
                out.append("\n".join(_dedent(lines[i:j])))
                literal_after, i = None, j
                continue
            literal_after = None
            if headings and not para and ind == 0:
                over = _ADORN.match(line)
                if over and i + 2 < n and lines[i + 1].strip() and (under := _ADORN.match(lines[i + 2])) \
                        and under.group(1) == over.group(1):
                    out.append(Heading(self._level(over.group(1), True), self.inline(lines[i + 1].strip())))
                    i += 3
                    continue
                under = _ADORN.match(lines[i + 1]) if i + 1 < n else None
                if not over and under and len(lines[i + 1].strip()) >= min(len(s), 4):
                    out.append(Heading(self._level(under.group(1), False), self.inline(s)))
                    i += 2
                    continue
            if s == ".." or s.startswith(".. "):
                flush()
                j = _block_end(lines, i + 1, ind)
                directive, footnote = _DIRECTIVE.match(line), _FOOTNOTE.match(line)
                if directive:
                    out += self.directive(directive.group(1), (directive.group(2) or "").strip(), lines[i + 1:j])
                elif footnote and not s.startswith(".. _"):
                    out += self.blocks([footnote.group(1)] + _dedent(lines[i + 1:j]), False)
                i = j  # comments, targets and substitution definitions are not text
                continue
            if _TABLE_BORDER.match(line) or (not para and _ADORN.match(line)):
                flush()  # a table border or a transition
                table = table or bool(_TABLE_BORDER.match(line))
                i += 1
                continue
            if table or _GRID_ROW.match(line):
                flush()
                cells = s.strip("|").split("|") if _GRID_ROW.match(line) else re.split(r"\s{2,}", s)
                row = " | ".join(self.inline(c) for c in cells if c.strip())
                if row:
                    out.append(row)
                i += 1
                continue
            block = _LINE_BLOCK.match(line)
            if block and not para:
                out.append(self.inline(block.group(1)))
                i += 1
                continue
            if s.startswith(">>> ") and not para:  # a doctest block: code up to the blank line
                j = i
                while j < n and lines[j].strip():
                    j += 1
                out.append("\n".join(_dedent(lines[i:j])))
                i = j
                continue
            bullet, field = _ITEM.match(line), _FIELD.match(line)
            if bullet or field:
                flush()
                if bullet:
                    para.append(bullet.group(4))
                    para_indent, text_indent = ind, ind + len(bullet.group(2)) + len(bullet.group(3))
                elif field.group(4):  # a field with no body (":orphan:") is metadata
                    para.append(f"{field.group(2)}: {field.group(4)}")
                    para_indent, text_indent = ind, ind + 1
                item = True
            elif para and (ind == text_indent or (item and ind > para_indent)):
                para.append(s)
            else:
                flush()
                para.append(s)
                para_indent = text_indent = ind
                item = False
            i += 1
        flush()
        return out

    def directive(self, name: str, args: str, body: list[str]) -> list[Event]:
        kind = name.rsplit(":", 1)[-1].lower()
        body = _dedent(body)
        while body and _OPTION.match(body[0]):  # options (":maxdepth: 2", ":linenos:") are not text
            body = body[1:]
        if kind in _MARKUP_ONLY or kind.startswith("auto"):
            return []
        if kind in _CODE:
            code = "\n".join(body).strip("\n")
            return [code] if code else ([args] if args else [])
        if kind in _LABELS or kind == "admonition":
            label = _LABELS.get(kind, "{}")
            if "{}" in label:
                first, _, args = args.partition(" ") if kind != "admonition" else (args, "", "")
                label = label.format(first)
            inner = self.blocks(([args] if args else []) + body, False)
            if inner and isinstance(inner[0], str):
                return [f"{label}: {inner[0]}"] + inner[1:]
            return [label] + inner
        inner = self.blocks(body, False)
        return ([self.inline(args)] if args and kind not in _ARGS_NOT_TEXT else []) + inner


def events(text: str) -> Iterator[Event]:
    yield from _Reader(text).blocks(text.expandtabs(8).splitlines())
