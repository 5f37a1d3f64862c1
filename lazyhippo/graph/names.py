"""Entity name normalization: the one definition used by the SQL models (as the DuckDB function `lh_norm`),
the Neo4j sync (which copies the warehouse's ids and norm_names) and the query engine's name lookups."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

_WORD = re.compile(r"[^\W_]+")  # Unicode letters and digits of any script
# marks on Latin letters only: 'é' -> 'e', but Cyrillic 'й' or Greek 'ά' stay distinct letters
_LATIN_MARKS = re.compile("(?<=[A-Za-z])[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")


def strip_accents(text: str) -> str:
    """Compatibility forms unified (NFKC) and accents dropped from Latin letters."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFC", _LATIN_MARKS.sub("", unicodedata.normalize("NFKD", text)))


def name_tokens(text: str) -> list[str]:
    """Word tokens with their case kept (accents dropped): punctuation and underscores separate words."""
    return _WORD.findall(strip_accents(text))


@lru_cache(maxsize=500_000)
def norm_key(name: str) -> str:
    """Normalized key of a name: accents dropped, case folded, punctuation to spaces, single spaces.
    'Müller' -> 'muller' but 'Mäller' -> 'maller'; Cyrillic and CJK names keep their letters."""
    return " ".join(t.casefold() for t in name_tokens(name))


_NOT_WORD_ASCII = "[^A-Za-z0-9]+"  # an ASCII text's non-word runs: what _WORD leaves out, accents aside


def norm_keys(names):
    """norm_key over an Arrow string array (nulls stay null). ASCII names, most of them, are keyed in Arrow
    compute: there strip_accents is the identity, words are runs of [A-Za-z0-9] and casefold is lower(),
    so the key is those runs lower-cased and joined by one space. The rest go through norm_key one by one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    ascii_ = pc.fill_null(pc.string_is_ascii(names), True)
    fast = pc.ascii_lower(pc.utf8_trim(pc.replace_substring_regex(names, _NOT_WORD_ASCII, " "), " "))
    if pc.all(ascii_).as_py():
        return fast
    slow = pa.array([None if a or n is None else norm_key(n) for n, a in zip(names.to_pylist(), ascii_.to_pylist())],
                    pa.string())
    return pc.if_else(ascii_, fast, slow)
