"""CPU per chunk of the offline extraction by where its noun phrases come from (parser, tags, none): the same
chunks extracted in this process with each in turn, alternating the order each round, the best round kept.

    python scripts/noun_phrase_cost.py SET=PATH[:EVERY] ... [--chunks 600] [--rounds 3] [--scratch DIR]

A PATH is a JSONL corpus (every EVERY-th line is read, default 1) or a folder of documents; e.g.
growth=growth100k.jsonl:16 2wiki=corpus.jsonl:7 gitdocs=gitdocs/src.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from lazyhippo.models.extractors import NOUN_PHRASES, NlpExtractor, _nlp_extract
from lazyhippo.sources.files import Document, read_path
from lazyhippo.stages.chunks import chunk_document


def items_of(spec: str, limit: int, scratch: Path) -> tuple[str, list[tuple[str, str, str | None]]]:
    """(title, text, section) of the first `limit` chunks of a corpus sample or of up to 60 of a folder's files."""
    name, _, rest = spec.partition("=")
    path, _, every = rest.partition(":")
    path = Path(path)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file())
        random.Random(0).shuffle(files)
        files, root = files[:60], path
    else:
        sample = scratch / f"{name}.jsonl"
        with path.open() as f, sample.open("w") as out:
            out.writelines(line for i, line in zip(range(limit * int(every or 1)), f) if i % int(every or 1) == 0)
        files, root = [sample], scratch
    chunks = [c for p in files for d in read_path(p, root, 20_000_000) if isinstance(d, Document)
              for c in chunk_document(d)]
    return name, [(c.title, c.text, c.section) for c in chunks[:limit]]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sets", nargs="+")
    ap.add_argument("--chunks", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = NlpExtractor().spacy_model
    with tempfile.TemporaryDirectory() as scratch:
        sets = [items_of(spec, args.chunks, Path(scratch)) for spec in args.sets]
    for name, items in sets:
        for mode in NOUN_PHRASES:
            _nlp_extract(model, mode, items[:40])  # the model loaded and warm
        cpu: dict[str, list[float]] = {m: [] for m in NOUN_PHRASES}
        for r in range(args.rounds):
            for mode in NOUN_PHRASES if r % 2 == 0 else NOUN_PHRASES[::-1]:
                t = time.process_time()
                _nlp_extract(model, mode, items)
                cpu[mode].append(time.process_time() - t)
        print(json.dumps({"set": name, "chunks": len(items), "chars": sum(len(t) for _, t, _ in items),
                          **{f"ms_per_chunk_{m}": round(1000 * min(v) / len(items), 2) for m, v in cpu.items()},
                          "rounds_s": {m: [round(x, 2) for x in v] for m, v in cpu.items()}}), flush=True)


if __name__ == "__main__":
    main()
