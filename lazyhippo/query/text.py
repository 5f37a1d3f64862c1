"""Text helpers shared by the query engine: name normalization, tokens, stopwords, sentences."""

from __future__ import annotations

import re

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


_HEADING = re.compile(r"^\s*#{1,6}\s+")


def strip_heading(text: str) -> str:
    return _HEADING.sub("", text)
