"""Text helpers shared by the query engine: name normalization, tokens, stopwords, sentences."""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

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


_COMBINING = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")


def strip_accents(text: str) -> str:
    if text.isascii():
        return text
    return _COMBINING.sub("", unicodedata.normalize("NFKD", text))


def fold(text: str) -> str:
    """Lower case without accents (NFKD, combining marks dropped)."""
    return strip_accents(text).lower()


def name_tokens(text: str) -> list[str]:
    """Word tokens with their case kept (accents dropped): punctuation and underscores separate words."""
    return _WORD.findall(strip_accents(text))


@lru_cache(maxsize=500_000)
def norm_key(name: str) -> str:
    """Normalized lookup key of a name: folded, punctuation to spaces, single spaces."""
    return " ".join(t.lower() for t in name_tokens(name))


def tokens(text: str) -> list[str]:
    """Folded word tokens (for BM25 and keyword overlap), stopwords and 1-char tokens removed."""
    return [t for t in _WORD.findall(fold(text)) if len(t) > 1 and t not in STOPWORDS]


_SENT = re.compile(r"(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\b[A-Z]\.)(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9#])|\n+")
_HEADING = re.compile(r"^\s*#{1,6}\s+")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text) if s and s.strip()]


def strip_heading(text: str) -> str:
    return _HEADING.sub("", text)
