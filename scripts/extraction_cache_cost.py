"""What the extraction cache costs and saves on an indexed home, read only (its warehouse and its cache).

    python scripts/extraction_cache_cost.py HOME [--namespace bench] [--every N] [--sample K] [--out FILE]

Every N-th row of the cache's whole-JSON table (`cache`, the rows written before packing) is packed against its
chunk's text: the payloads' bytes before and after, and whether every one comes back exactly. With --out (and
N 1) the packed rows are written to a new cache file, whose size is printed. With --sample K, K chunks are
extracted afresh in this process (one core, the namespace's extractor) and the CPU milliseconds per chunk of
that extraction, of a cache write and of a cache read (whole JSON and packed) are printed.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import time
import zlib
from pathlib import Path

os.environ["LAZYHIPPO_THREADS"] = "1"  # the extraction in this process, as in a batch step of a parallel run

import duckdb  # noqa: E402

from lazyhippo.models.extractors import ExtractionCache  # noqa: E402
from lazyhippo.stages.chunks import Chunk  # noqa: E402
from lazyhippo.stages.extractions import make_extractor  # noqa: E402
from lazyhippo.stores.cache import _compress, _text, pack_extraction, unpack_extraction  # noqa: E402
from lazyhippo.stores.namespaces import namespace_settings  # noqa: E402


def cpu_ms(call, n: int):
    t = time.process_time()
    out = call()
    return out, (time.process_time() - t) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("home", type=Path)
    ap.add_argument("--namespace", default="bench")
    ap.add_argument("--every", type=int, default=1)
    ap.add_argument("--sample", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    settings = namespace_settings(args.home, args.namespace)
    extractor = make_extractor(settings)
    src = sqlite3.connect(f"file:{settings.cache_dir / 'extractions.sqlite'}?mode=ro", uri=True)
    rows, stored = src.execute("SELECT count(*), sum(length(payload)) FROM cache").fetchone()
    held = dict(src.execute("SELECT key, payload FROM cache WHERE rowid % ? = 0", [args.every]))
    con = duckdb.connect(str(settings.db_path), read_only=True)
    cur = con.execute(f"SELECT {', '.join(Chunk.__dataclass_fields__)} FROM chunks WHERE namespace = ?",
                      [settings.namespace])
    chunks = {}
    while batch := cur.fetchmany(20_000):
        for r in batch:
            c = Chunk(*r)
            if (k := ExtractionCache.key(c, extractor)) in held:
                chunks[k] = c
    before = after = exact = 0
    texts, sources = {}, {}
    for k, c in chunks.items():
        text = _text(held[k])
        packed = pack_extraction(text, c.text)
        before, after = before + len(held[k]), after + len(packed)
        exact += unpack_extraction(packed, c.text) == text
        if args.out:
            texts[k], sources[k] = text, c.text
    print(f"cache: {rows} rows, {stored / 1e6:.1f} MB of payloads; {len(chunks)} rows read (every {args.every}), "
          f"{before / 1e6:.2f} -> {after / 1e6:.2f} MB packed ({after / before:.3f}); exact {exact}/{len(chunks)}; "
          f"all rows about {stored * after / before / 1e6:.1f} MB")
    if args.out:
        cache = ExtractionCache(args.out)
        items = list(texts.items())
        for i in range(0, len(items), 256):
            cache.put_texts(dict(items[i:i + 256]), sources)
        cache.close()
        print(f"{args.out}: {args.out.stat().st_size / 1e6:.2f} MB")
    if args.sample:
        random.seed(1)
        sample = random.sample(list(chunks.values()), min(args.sample, len(chunks)))
        n = len(sample)
        extract = getattr(extractor, "extract_json", None) or extractor.extract
        extract(sample[:20])  # the model loaded
        fresh, t_extract = cpu_ms(lambda: extract(sample), n)
        whole, t_write = cpu_ms(lambda: [_compress(t) for t in fresh], n)
        packed, t_pack = cpu_ms(lambda: [pack_extraction(t, c.text) for t, c in zip(fresh, sample)], n)
        _, t_read = cpu_ms(lambda: [zlib.decompress(p).decode() for p in whole], n)
        back, t_unpack = cpu_ms(lambda: [unpack_extraction(p, c.text) for p, c in zip(packed, sample)], n)
        print(f"CPU ms a chunk ({n} chunks): extraction {t_extract:.2f}; write whole {t_write:.3f}, packed "
              f"{t_pack:.3f}; read whole {t_read:.3f}, packed {t_unpack:.3f}; exact {back == fresh}")


if __name__ == "__main__":
    main()
