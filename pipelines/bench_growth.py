"""`lazyhippo bench index --growth 1000,10000`: what an index costs as the corpus grows. Per corpus size, a full
index from an empty home through Dagster in-process (the CLI default): wall time, MB of text a minute, peak RSS
of the process tree, the home's size on disk against the corpus text, rows per table, and the local route's
query latency. The corpus is real text, mixed in the same proportions at every size (`growth_corpus`)."""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
from contextlib import contextmanager
from functools import lru_cache
from itertools import islice, zip_longest
from pathlib import Path
from typing import Callable, Iterator

import polars as pl

from lazyhippo.settings import Settings
from lazyhippo.sources.files import read_markup
from lazyhippo_dagster.bench_process import TreeRss

DEBIAN_DOCS = Path("/usr/share/doc")
TEXT_SUFFIXES = ("", ".txt", ".md", ".rst")  # Debian documentation read as text (changelog.gz, README)
PIECE_CHARS = 3000  # long texts (gitdocs pages, Debian docs) are split into documents of about this size


def _paragraphs(text: str) -> Iterator[str]:
    """Paragraphs, a longer one than PIECE_CHARS cut at line ends (a data table or a log is one long paragraph)."""
    for para in re.split(r"\n\s*\n", text):
        part = ""
        for line in para.strip().splitlines():
            if part and len(part) + 1 + len(line) > PIECE_CHARS:
                yield part
                part = ""
            part = f"{part}\n{line}" if part else line
        if part:
            yield part


def _pieces(text: str) -> Iterator[str]:
    """Paragraphs packed into pieces of about PIECE_CHARS characters (a longer line is a piece of its own)."""
    piece = ""
    for para in _paragraphs(text):
        if piece and len(piece) + len(para) > PIECE_CHARS:
            yield piece
            piece = ""
        piece = f"{piece}\n\n{para}" if piece else para
    if piece:
        yield piece


def _files(root: Path, label: str, read: Callable[[Path], str | None]) -> Iterator[dict]:
    seen: set[int] = set()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        try:
            text = read(path)
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
            continue
        if not text or hash(text) in seen:  # Debian ships the same licence text in many packages
            continue
        seen.add(hash(text))
        rel = path.relative_to(root).as_posix()
        for i, piece in enumerate(_pieces(text)):
            yield {"id": f"{label}/{rel}#{i}", "title": f"{rel} ({i + 1})", "text": piece}


def _debian_text(path: Path) -> str | None:
    plain = path.with_suffix("") if path.suffix == ".gz" else path  # a compressed file by its inner name
    html = plain.suffix == ".html" and not _sphinx_build(path.parent)  # Sphinx pages: read from `_sources`
    stem = plain.name.split(".")[0]
    if not (html or plain.suffix in TEXT_SUFFIXES or (stem.isalpha() and stem.isupper())):  # README.Debian, NEWS
        return None  # PostScript, images, Sphinx's HTML twin of a source: not prose a user indexes as text
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    if b"\0" in data[:4096]:
        return None
    if not html:
        return data.decode("utf-8")
    _, sections = read_markup("html", data.decode("utf-8"))
    return "\n\n".join(text for _, text in sections if text)  # a section's text starts with its heading


@lru_cache(maxsize=None)
def _sphinx_build(folder: Path) -> bool:
    """A Sphinx build ships each page's source beside its HTML (`_sources/`), read as text instead."""
    return (folder / "_sources").is_dir() or (folder.parent != folder and _sphinx_build(folder.parent))


def _jsonl(path: Path) -> Iterator[dict]:
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            yield {"id": f"{path.parent.name}/{row['id']}", "title": row.get("title", ""), "text": row["text"]}


def growth_corpus(datasets: Path, documents: int, debian_docs: Path = DEBIAN_DOCS) -> list[dict]:
    """`documents` rows {id, title, text} taken in turn from each real source (the shared sets' corpora, the
    gitdocs pages and the Debian package documentation, long texts split into ~3,000-character documents), so
    every size has the same mix. Raises ValueError when the sources hold fewer documents."""
    sources = [_jsonl(p) for p in sorted(datasets.glob("*/corpus.jsonl"))]
    sources.append(_files(datasets / "gitdocs" / "src", "gitdocs", lambda p: p.read_text() if p.suffix == ".txt" else None))
    if debian_docs.is_dir():
        sources.append(_files(debian_docs, "debian", _debian_text))
    rows = []
    for group in zip_longest(*sources):
        rows += [r for r in group if r is not None]
        if len(rows) >= documents:
            return rows[:documents]
    raise ValueError(f"--growth {documents}: the real text at hand gives only {len(rows)} documents")


def disk_bytes(paths: list[Path], seen: set[tuple[int, int]] | None = None) -> int:
    """Bytes the files under `paths` take on disk (allocated blocks, as `du`): a file with several names (a
    snapshot hard-linked to the warehouse) counts once, the first time `seen` meets it."""
    seen = set() if seen is None else seen
    total = 0
    for path in paths:
        if not path.exists():  # a part the home does not have (yet): no bytes
            continue
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            st = p.lstat()
            if p.is_file() and not p.is_symlink() and (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _parts(home: Path) -> dict[str, int]:
    """The home's size by part: work warehouse, published snapshots (what they do not share with the
    warehouse), the query index cache beside them, caches, object store, Dagster."""
    from lazyhippo.query.loader import _CACHE_DIR as CACHE_DIR

    seen: set[tuple[int, int]] = set()
    published = home / "published"
    parts = {"warehouse": disk_bytes(sorted(home.glob("warehouse.duckdb*")), seen),
             "index cache": disk_bytes([published / CACHE_DIR], seen), "published": disk_bytes([published], seen),
             "cache": disk_bytes([home / "cache"], seen), "objects": disk_bytes([home / "objects"], seen),
             "dagster": disk_bytes([home / "dagster"], seen)}
    parts["total"] = sum(parts.values()) + disk_bytes([home], seen)
    return parts


def growth_questions(datasets: Path, n: int) -> list[dict]:
    """The first `n` questions of the shared sets, asked of a growth home to time its local route."""
    qs = [q for p in sorted(datasets.glob("*/questions_dev.json")) for q in json.loads(p.read_text())[:n]]
    return qs[:n] or [{"question": "What does the documentation say about configuration?"}]


def growth_source(datasets: Path, documents: int, source: Path, corpus: Path | None = None) -> int:
    """Fill the empty folder `source` with `documents` documents and return the bytes of their text: the mixed
    real text of `growth_corpus`, or the first documents of `corpus` (a JSONL file's first rows, a folder's first
    files in path order, copied whole). Raises ValueError when there are fewer."""
    from lazyhippo.sources.files import iter_files
    from lazyhippo_dagster.bench_index import write_jsonl_source

    if corpus is None or corpus.is_file():
        if corpus is None:
            rows = growth_corpus(datasets, documents)
        else:
            with corpus.open() as f:
                rows = [json.loads(line) for line in islice((line for line in f if line.strip()), documents)]
        if len(rows) < documents:
            raise ValueError(f"--growth {documents}: {corpus} holds only {len(rows)} documents")
        write_jsonl_source(source, [json.dumps(r) for r in rows])
        return sum(len(r["text"].encode()) for r in rows)
    files = sorted(iter_files(corpus))[:documents]
    if len(files) < documents:
        raise ValueError(f"--growth {documents}: {corpus} holds only {len(files)} documents")
    for f in files:
        (source / f.relative_to(corpus)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, source / f.relative_to(corpus))
    return sum(f.stat().st_size for f in files)


@contextmanager
def own_instance(home: Path) -> Iterator:
    """The home's own Dagster instance (`<home>/dagster`), with DAGSTER_HOME naming it while the size runs and
    restored after: each size's event log counts in its own home's size."""
    from lazyhippo_dagster.runner import instance_for

    previous = os.environ.get("DAGSTER_HOME")
    os.environ["DAGSTER_HOME"] = str((home / "dagster").resolve())
    try:
        yield instance_for(home)
    finally:
        if previous is None:
            os.environ.pop("DAGSTER_HOME", None)
        else:
            os.environ["DAGSTER_HOME"] = previous


def run_growth_bench(datasets: Path, sizes: list[int], workdir: Path, progress: Callable[[str], None] = print,
                     queries: int = 20, corpus: Path | None = None, on_size: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Per size in turn; `on_size` gets the results so far after each size (a long run keeps what it measured)."""
    from lazyhippo.evaluate.bench import run_latency_bench
    from lazyhippo.query import clear_cache
    from lazyhippo.stages.common import give_back_memory
    from lazyhippo.stores.warehouse import counts
    from lazyhippo_dagster.bench_index import _timed_index, step_spans

    out = []
    for n in sizes:
        folder = workdir / f"growth_{n}"
        if folder.exists():
            shutil.rmtree(folder)
        (folder / "source").mkdir(parents=True)
        text_bytes = growth_source(datasets, n, folder / "source", corpus)
        progress(f"{n} documents ({text_bytes / 1e6:.1f} MB of text): full index in-process")
        home = folder / "home"
        load = os.getloadavg()
        with TreeRss() as rss, own_instance(home) as instance:
            timed = _timed_index(home, folder / "source", None, instance=instance, progress=progress)
            spans = step_spans(instance, timed["run_ids"])
        settings = Settings(home=home, namespace="bench")
        progress(f"{n} documents: local route latency")
        latency = run_latency_bench(settings, growth_questions(datasets, queries), ["local"], repeat=1)["local"]
        clear_cache()  # the next size's peak must not hold this size's query index
        give_back_memory()  # nor start from the heap this size freed
        disk = _parts(home)
        out.append({"documents": n, "text_mb": round(text_bytes / 1e6, 2), "seconds": round(timed["seconds"], 1),
                    "mb_per_minute": round(text_bytes / 1e6 / timed["seconds"] * 60, 2),
                    "peak_rss_mb": round(rss.peak / 1e6), "home_mb": round(disk["total"] / 1e6, 1),
                    "home_ratio": round(disk["total"] / text_bytes, 1),
                    "home_parts_mb": {k: round(v / 1e6, 1) for k, v in disk.items() if k != "total"},
                    "rows": counts(settings), "local_p50_ms": round(latency["p50_ms"], 1), "local_p95_ms": round(latency["p95_ms"], 1),
                    "load_start": [round(x, 1) for x in load], "load_end": [round(x, 1) for x in os.getloadavg()],
                    "peak_rss_processes": rss.by_role(), "peak_rss_steps_mb": _step_peaks(rss, spans)})
        if on_size is not None:
            on_size(out)
    return out


def _step_peaks(rss: TreeRss, spans: dict[str, tuple[float, float]]) -> dict[str, dict[str, int]]:
    """Per step (in the order they started): the tree's and the run process's peak resident MB while it ran."""
    out = {}
    for step, (start, end) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        tree, own = rss.peak_between(start, end)
        out[step] = {"tree": round(tree / 1e6), "run_process": round(own / 1e6)}
    return out


def growth_table(results: list[dict]) -> pl.DataFrame:
    """One row per figure, one column per corpus size (a table per size would not fit a terminal)."""
    figures = {"text MB": "text_mb", "seconds": "seconds", "MB of text a minute": "mb_per_minute",
               "peak RSS MB (process tree)": "peak_rss_mb", "home MB": "home_mb", "home / text": "home_ratio",
               "local p50 ms": "local_p50_ms", "local p95 ms": "local_p95_ms"}
    rows = [{"figure": name, **{f"{r['documents']} docs": round(float(r[key]), 1) for r in results}}
            for name, key in figures.items()]
    # how loaded the machine was: the 1-minute load average when the size started and when it ended
    rows += [{"figure": f"load average at {when}", **{f"{r['documents']} docs": float(r[f"load_{when}"][0]) for r in results}}
             for when in ("start", "end")]
    parts = results[0]["home_parts_mb"] if results else {}
    rows += [{"figure": f"  {part} MB", **{f"{r['documents']} docs": float(r["home_parts_mb"][part]) for r in results}}
             for part in parts]
    return pl.DataFrame(rows)


def growth_rows_table(results: list[dict]) -> pl.DataFrame:
    tables = list(results[0]["rows"]) if results else []
    return pl.DataFrame([{"table": t, **{f"{r['documents']} docs": r["rows"][t] for r in results}} for t in tables])


def growth_memory_table(results: list[dict]) -> pl.DataFrame:
    """Where the peak is: per step, then per kind of process, the peak resident MB at each size ("tree / run
    process" for a step: all processes together, and the run's own process)."""
    steps = list(dict.fromkeys(k for r in results for k in r["peak_rss_steps_mb"]))
    rows = [{"where": step, **{f"{r['documents']} docs": (f"{v['tree']} / {v['run_process']}" if (v := r["peak_rss_steps_mb"].get(step)) else "")
                               for r in results}} for step in steps]
    roles = list(dict.fromkeys(k for r in results for k in r["peak_rss_processes"]))
    rows += [{"where": f"{role} (processes, largest peak, at the tree's peak)",
              **{f"{r['documents']} docs": (f"{v['processes']}, {v['largest_peak_mb']}, {v['at_tree_peak_mb']}"
                                            if (v := r["peak_rss_processes"].get(role)) else "") for r in results}}
             for role in roles]
    return pl.DataFrame(rows)
