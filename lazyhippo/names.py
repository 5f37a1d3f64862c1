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
