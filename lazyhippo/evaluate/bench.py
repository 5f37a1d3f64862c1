"""Retrieval and latency benchmarks on a corpus with gold supporting passages (2WikiMultiHopQA format:
questions carry `supporting_titles`, and `supporting_ids` where titles repeat, as in MuSiQue) or gold source
files (`gold_files`, paths inside a folder corpus, as in gitdocs: a ranking is scored by its distinct files)."""

from __future__ import annotations

import hashlib
import os
import shutil
import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import polars as pl

from lazyhippo.models.embedders import embedding_model_name
from lazyhippo.settings import QUERY_FIELDS, Settings, child_environment

Ranker = Callable[[str], list[str]]  # question -> ranked passage keys (ids, titles or files: see gold_key)

DATASETS = {"2wiki": "2wikimultihopqa", "hotpotqa": "hotpotqa", "musique": "musique", "gitdocs": "gitdocs"}
GOLD_FIELDS = ("gold_files", "supporting_ids", "supporting_titles")  # the first every question carries scores


def dataset_files(name: str, root: Path) -> tuple[Path, Path]:
    """(corpus, questions_dev.json) of a shared set by short name: the corpus is the set's `src/` folder when it
    has one (a folder of documents, indexed as a folder), else its `corpus.jsonl`."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} (expected one of {', '.join(DATASETS)} or all)")
    folder = root / DATASETS[name]
    corpus = folder / "src" if (folder / "src").is_dir() else folder / "corpus.jsonl"
    questions = folder / "questions_dev.json"
    for f in (corpus, questions):
        if not f.exists():
            raise FileNotFoundError(f"dataset {name!r}: {f} does not exist")
    return corpus, questions


def gold_key(questions: Sequence[dict]) -> str:
    """What a ranking is scored by: source files when every question names its gold files, else passage ids when
    every question names its supporting ids (titles may repeat), else titles."""
    return next((k for k in GOLD_FIELDS[:2] if questions and all(q.get(k) for q in questions)), GOLD_FIELDS[2])


def passage_id(source: str) -> str:
    """The JSONL row id of a chunk's source (`corpus.jsonl#<id>`), else the source itself."""
    return source.rsplit("#", 1)[1] if "#" in source else source


def passage_key(source: str, title: str, gold_field: str) -> str:
    """A chunk's key under `gold_field`: its source file (a folder corpus's relative path), its row id, or its title."""
    return {"gold_files": source, "supporting_ids": passage_id(source)}.get(gold_field, title)


def distinct(titles: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    return [t for t in titles if not (t in seen or seen.add(t))]


def recall_at_k(ranked: Sequence[str], gold: Sequence[str], k: int) -> float:
    """Share of the gold passages (or files) among the top-k distinct retrieved ones."""
    gold_set = set(gold)
    return len(gold_set & set(distinct(ranked)[:k])) / len(gold_set) if gold_set else 0.0


def all_supporting_at_k(ranked: Sequence[str], gold: Sequence[str], k: int) -> float:
    return float(set(gold) <= set(distinct(ranked)[:k]))


SPLITS = ("tune", "confirm", "all")
KEEP_METRICS = ("recall_at_2", "recall_at_5", "all_supporting_at_8")


def split_of(question: str) -> str:
    """The half a question belongs to, by a hash of its text (the same rule for every set): a change to a
    retrieval default is decided on the tune half and checked on the confirm half, which nobody tunes on."""
    digest = hashlib.sha256(question.strip().encode("utf-8")).digest()
    return "tune" if digest[0] % 2 == 0 else "confirm"


def select_split(questions: Sequence[dict], split: str) -> list[dict]:
    """The questions of one half (`tune` or `confirm`), or all of them."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})")
    return list(questions) if split == "all" else [q for q in questions if split_of(q["question"]) == split]


def split_figures(rows: Sequence[dict]) -> dict[str, dict]:
    """Per half present in `rows` (per-question results): question count and the mean of each metric."""
    out = {}
    for half in ("tune", "confirm"):
        part = [r for r in rows if split_of(r["question"]) == half]
        if part:
            out[half] = {"questions": len(part), **{m: sum(r[m] for r in part) / len(part) for m in KEEP_METRICS}}
    return out


def hops_figures(rows: Sequence[dict]) -> dict[str, dict]:
    """Per number of gold documents a question needs (`hops`, when the questions carry it: gitdocs' single-file
    and two-file questions), per half: question count and the mean of each metric."""
    return {f"hops {h}": split_figures([r for r in rows if r.get("hops") == h])
            for h in sorted({r["hops"] for r in rows if r.get("hops") is not None})}


def keep_change(base: dict[str, list[dict]], candidate: dict[str, list[dict]], require_gain: bool = True) -> dict:
    """The keep rule over the confirm halves: `base` and `candidate` map a set name to the route's
    per-question rows. A change is kept when no set's confirm half loses more than one question's worth on
    recall@2, recall@5 or all_supporting@8 (a sum over its questions), and, with `require_gain`, at least
    one of those sums rises (removing a knob only needs the first part)."""
    deltas, lost, gained = {}, [], False
    for name, rows in base.items():
        if name not in candidate:
            raise ValueError(f"set {name!r} is missing from the candidate results")
        before = {r["question"]: r for r in rows if split_of(r["question"]) == "confirm"}
        after = {r["question"]: r for r in candidate[name] if split_of(r["question"]) == "confirm"}
        if before.keys() != after.keys():
            raise ValueError(f"set {name!r}: the two runs hold different confirm questions")
        for m in KEEP_METRICS:
            d = sum(after[q][m] - before[q][m] for q in before)
            deltas[f"{name} {m}"] = round(d, 4)
            if d < -1.0 - 1e-9:
                lost.append(f"{name} {m}")
            gained |= d > 1e-9
    return {"keep": not lost and (gained or not require_gain), "lost": lost, "gained": gained,
            "delta_questions": deltas}


def ranking_changes(base: dict[str, list[dict]], candidate: dict[str, list[dict]], k: int = 8) -> dict:
    """Per set, the questions whose first `k` retrieved passages, in order, differ between two runs (`base` and
    `candidate` map a set name to the route's per-question rows): a change meant to leave every answer alone,
    such as a speedup, must move none."""
    sets = {}
    for name, rows in base.items():
        if name not in candidate:
            raise ValueError(f"set {name!r} is missing from the candidate results")
        after = {r["question"]: r["retrieved"][:k] for r in candidate[name]}
        if after.keys() != {r["question"] for r in rows}:
            raise ValueError(f"set {name!r}: the two runs hold different questions")
        moved = [r["question"] for r in rows if r["retrieved"][:k] != after[r["question"]]]
        sets[name] = {"questions": len(rows), "same": len(rows) - len(moved), "moved": moved}
    return {"same": not any(s["moved"] for s in sets.values()), "sets": sets}


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    """The q-th percentile in milliseconds, interpolated linearly between the two nearest values."""
    return float((pl.Series(seconds, dtype=pl.Float64) * 1000.0).quantile(q / 100, "linear")) if seconds else 0.0


@dataclass
class MethodReport:
    method: str
    recall_at_2: float
    recall_at_5: float
    all_supporting_at_8: float
    latency_p50_ms: float
    latency_p95_ms: float
    per_question: list[dict] = field(default_factory=list)

    def headline(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items() if k != "per_question"}


def evaluate(method: str, ranker: Ranker, questions: Sequence[dict], k: int = 8,
             progress: Callable[[str, int, int], None] | None = None, gold_field: str = "supporting_titles") -> MethodReport:
    rows, lat = [], []
    for i, q in enumerate(questions):
        t0 = time.perf_counter()
        ranked = distinct(ranker(q["question"]))
        lat.append(time.perf_counter() - t0)
        gold = q[gold_field]
        rows.append({"question": q["question"], gold_field: gold, "retrieved": ranked[:max(k, 8)],
                     **({"hops": q["hops"]} if "hops" in q else {}),
                     "recall_at_2": recall_at_k(ranked, gold, 2), "recall_at_5": recall_at_k(ranked, gold, 5),
                     "all_supporting_at_8": all_supporting_at_k(ranked, gold, 8)})
        if progress:
            progress(method, i + 1, len(questions))
    metrics = ("recall_at_2", "recall_at_5", "all_supporting_at_8")
    means = pl.DataFrame({m: [r[m] for r in rows] for m in metrics}, schema=dict.fromkeys(metrics, pl.Float64)).mean()
    return MethodReport(method, *(float(means[m][0] or 0.0) for m in metrics),
                        percentile_ms(lat, 50), percentile_ms(lat, 95), rows)


def file_sha(path: Path) -> str:
    """SHA-256 of a file, or of a folder's files (their relative paths and contents, in path order)."""
    h = hashlib.sha256()
    files = sorted(f for f in path.rglob("*") if f.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            h.update(file.relative_to(path).as_posix().encode("utf-8") + b"\0")
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def ensure_index(corpus: Path, workdir: Path, progress=None, settings: Settings | None = None) -> tuple[Settings, dict]:
    """Index `corpus` into `workdir` unless it already holds this exact corpus (same hash, same settings, same
    offline extraction version: a change to what extraction keeps must rebuild the graph it is measured on)."""
    from lazyhippo.index import run_index
    from lazyhippo.models.extractors import NlpExtractor

    settings = (settings or Settings.from_env()).with_(home=workdir.resolve(), source=str(corpus.resolve()))
    stamp_file = workdir / "bench_corpus.json"
    stamp = {"corpus_sha256": file_sha(corpus), "settings": {k: str(v) for k, v in asdict(settings).items()
                                                              if k != "home" and k not in QUERY_FIELDS},
             "embedding_model": embedding_model_name(settings.embedder, settings.embedding_model),
             "extraction": NlpExtractor.prompt_version if settings.extractor == "nlp" else settings.extractor}
    if stamp_file.exists():
        old = json.loads(stamp_file.read_text())
        if {k: old.get(k) for k in stamp} == stamp:
            return settings, {"reused": True, "index_seconds": old["index_seconds"]}
    t0 = time.perf_counter()
    run_index(settings, progress=progress, run_id="bench")
    seconds = time.perf_counter() - t0
    stamp_file.write_text(json.dumps({**stamp, "index_seconds": seconds}))
    return settings, {"reused": False, "index_seconds": seconds}


def served_ppr(settings: Settings, store) -> object | None:
    """Push the index (built on the embedded store) to `store` and return its PPR backend; None when the
    store is the embedded one (in-process PPR over the loaded index)."""
    if store.name == "embedded":
        return None
    from lazyhippo.index import sync_all
    from lazyhippo.stores.warehouse import connect

    with connect(settings) as con:
        sync_all(store, con, settings.namespace)
    return store.ppr_backend(settings.namespace)


def retrieval_rankers(settings: Settings, routes: Sequence[str], k: int, ppr=None,
                      gold_field: str = "supporting_titles", assist=None, config=None,
                      picked: dict[str, dict[str, str]] | None = None) -> dict[str, Ranker]:
    """The routes under test (with `config`, a QueryConfig, else the defaults; with `assist`, a RetrievalAssist,
    its LLM steps) and the two baselines on the same index and chunk budget `k`: BM25 (bm25s over the chunks)
    and dense-only (same embedder). Rankers return passage keys (`passage_key`). `picked`, when given, gets
    per route the route each question ran (what `auto` chose)."""
    from lazyhippo.models.embedders import get_embedder
    from lazyhippo.query import search
    from lazyhippo.query.loader import load_index
    from lazyhippo.query.nearest import top_indices
    from lazyhippo.query.types import PreparedQuery

    idx = load_index(settings)
    embedder = get_embedder(settings.embedder, settings.embedding_model)

    def channel(name: str) -> Ranker:
        def rank(question: str) -> list[str]:
            scores = getattr(PreparedQuery(idx, question, embedder), name)
            return [passage_key(idx.chunks.sources[c], idx.chunks.titles[c], gold_field)
                    for c in top_indices(scores, k) if scores[c] > 0]
        return rank

    def route_ranker(route: str) -> Ranker:
        def rank(question: str) -> list[str]:
            found = search(settings, question, route, k, ppr=ppr, assist=assist, config=config)
            if picked is not None:
                picked.setdefault(route, {})[question] = found.route
            return [passage_key(c.source, c.title, gold_field) for c in found.chunks]
        return rank

    return {**{route: route_ranker(route) for route in routes}, "bm25": channel("bm25"), "dense": channel("dense")}


def run_retrieval_bench(corpus: Path, questions_file: Path, workdir: Path, route: str | Sequence[str] = "local",
                        k: int = 8, progress=None, graph_store: str = "embedded", settings: Settings | None = None,
                        split: str = "all", assist=None, config=None) -> dict:
    """Quality of `route` (one, or several: the first is the one under test, which `bench keep` compares; with
    `config`, a QueryConfig) on the index of `corpus` (a JSONL file or a folder) over the questions of `split`,
    ranked through `graph_store` (neo4j: the index is pushed to the server first and PPR runs over the graph it
    serves). With `assist` (a RetrievalAssist) the routes use its LLM steps and the tokens used are reported."""
    from lazyhippo.stores import open_graph_store

    routes = [route] if isinstance(route, str) else list(route)
    questions = select_split(json.loads(Path(questions_file).read_text()), split)
    field_ = gold_key(questions)
    settings, index_info = ensure_index(Path(corpus), Path(workdir), progress, settings)
    store = open_graph_store(graph_store)
    picked: dict[str, dict[str, str]] = {}
    try:
        before = assist.llm.meter.snapshot() if assist else {}
        rankers = retrieval_rankers(settings, routes, k, served_ppr(settings, store), gold_field=field_, assist=assist,
                                    config=config, picked=picked)
        reports = [evaluate(name, ranker, questions, k, progress, field_) for name, ranker in rankers.items()]
        usage = assist.llm.meter.since(before) if assist else []
    finally:
        store.close()
    for r in reports:
        for row in r.per_question if r.method in picked else ():
            row["route_used"] = picked[r.method][row["question"]]
    by = {r.method: r for r in reports}
    main = routes[0]
    return {
        "corpus": str(corpus), "questions": len(questions), "split": split, "route": main, "routes": routes, "k": k,
        "graph_store": graph_store, "scored_by": field_, "embedder": settings.embedder, **index_info,
        "methods": {r.method: r.headline() for r in reports},
        "halves": {r.method: split_figures(r.per_question) for r in reports},
        "by_hops": {r.method: hops_figures(r.per_question) for r in reports},
        "routes_used": {name: dict(Counter(choice.values()).most_common()) for name, choice in picked.items()},
        **({"llm": {"model": assist.llm.model, "usage": usage, "breaker": assist.breaker.state}} if assist else {}),
        "margin_over_dense": {m: round(getattr(by[main], m) - getattr(by["dense"], m), 4) for m in KEEP_METRICS},
        "margin_over_bm25": {m: round(getattr(by[main], m) - getattr(by["bm25"], m), 4) for m in KEEP_METRICS},
        "per_question": {r.method: r.per_question for r in reports},
    }


def summary_row(name: str, result: dict) -> dict:
    """One line of the all-datasets table (short keys, to fit a terminal): the route's three figures on the
    tune and the confirm half side by side ("-" for a half not run), BM25's recall@5 and all_supporting@8 the
    same way, dense-only's recall@5, the route's p50 latency and the index time."""
    m, route = result["methods"], result["route"]
    halves, bm25 = result["halves"][route], result["halves"]["bm25"]
    sides = {f"{short} {h[0]}": round(halves[h][metric], 3) if h in halves else "-"
             for short, metric in (("r@2", "recall_at_2"), ("r@5", "recall_at_5"), ("all@8", "all_supporting_at_8"))
             for h in ("tune", "confirm")}
    base = {f"bm25 {short} {h[0]}": round(bm25[h][metric], 3) if h in bm25 else "-"
            for short, metric in (("r@5", "recall_at_5"), ("all@8", "all_supporting_at_8")) for h in ("tune", "confirm")}
    return {"set": name, "n t/c": "/".join(str(halves[h]["questions"]) if h in halves else "0" for h in ("tune", "confirm")),
            **sides, **base,
            "dense r@5": round(m["dense"]["recall_at_5"], 3), "p50 ms": round(m[route]["latency_p50_ms"], 1),
            "index s": round(result["index_seconds"], 1), "reused": result["reused"]}


def part_rows(result: dict) -> list[dict]:
    """Every method's figures per half, and per `hops` group and half when the questions carry it (one row each)."""
    rows = []
    for method, halves in result["halves"].items():
        parts = {**halves, **{f"{g} {h}": fig for g, by in result.get("by_hops", {}).get(method, {}).items()
                              for h, fig in by.items()}}
        for part, fig in parts.items():
            rows.append({"method": method, "part": part, "n": fig["questions"],
                         **{m: round(fig[m], 3) for m in KEEP_METRICS}})
    return rows


def headline(result: dict) -> dict:
    route = result["route"]
    m = result["methods"]
    halves = {f"{half}_{k}": round(v, 4) for half, fig in result["halves"][route].items() for k, v in fig.items()}
    return {"route": route, **{f"{route}_{k}": v for k, v in m[route].items() if k != "method"}, **halves,
            "dense_recall_at_5": m["dense"]["recall_at_5"], "bm25_recall_at_5": m["bm25"]["recall_at_5"],
            "index_seconds": round(result["index_seconds"], 1), "reused_index": result["reused"],
            **({"llm_usage": result["llm"]["usage"]} if "llm" in result else {})}


def run_latency_bench(settings: Settings, questions: Sequence[dict], routes: Sequence[str], repeat: int = 3,
                      graph_store: str = "embedded") -> dict:
    """Warm the index once, then time offline queries per route: retrieval + context assembly (query
    embedding included), and the whole call with the extractive answer."""
    from lazyhippo.query import answer_question
    from lazyhippo.stores import open_graph_store

    store = open_graph_store(graph_store)
    try:
        ppr = served_ppr(settings, store)
        answer_question(settings, questions[0]["question"], route=routes[0], ppr=ppr)  # load + warm
        out = {}
        for route in routes:
            ctx, total = [], []
            for _ in range(repeat):
                for q in questions:
                    t0 = time.perf_counter()
                    res = answer_question(settings, q["question"], route=route, ppr=ppr, llm=None)
                    total.append(time.perf_counter() - t0)
                    ctx.append(sum(res.timings.get(k, 0.0) for k in ("load_ms", "retrieve_ms", "rerank_ms", "assemble_ms")) / 1000)
            out[route] = {"p50_ms": percentile_ms(ctx, 50), "p95_ms": percentile_ms(ctx, 95),
                          "answer_p50_ms": percentile_ms(total, 50), "answer_p95_ms": percentile_ms(total, 95), "n": len(ctx)}
        return out
    finally:
        store.close()


def run_cli_latency(settings: Settings, questions: Sequence[dict], runs: int, baseline: Path | None = None,
                    warm: bool = False) -> dict:
    """Wall time of `lazyhippo query` as a user runs it: one new process per question (interpreter start,
    imports, the Dagster run, the index load and the answer), and its CPU time (user + system, with the processes
    it waited for): what it would take on an idle core, the steadier figure on a shared machine. The first run is
    reported apart: after a re-index it also writes the index's disk cache. `baseline`: another build's
    `lazyhippo` executable, whose commands alternate with this build's on the same questions, so that both see
    the same load (its figures as `baseline_*`, and this build's p50s over its as ratios). It reads a copy of the
    home (hard links, without the index's disk cache): a build whose loader differs keys that cache otherwise, and
    each build would drop the other's. `warm`: the same commands also through the home's query daemon, started
    first, in turn with the cold ones (`warm_*`; `warm_daemon_cpu_p50_ms`: the daemon's CPU time per query).
    The cold commands never use nor start a daemon. The load average is reported before and after."""
    import tempfile

    executable = Path(sys.executable).with_name("lazyhippo")
    commands = {"": Command(executable, settings.home, {"LAZYHIPPO_QUERY_DAEMON": "0"})}
    if baseline:
        scratch = Path(tempfile.mkdtemp(prefix=".baseline-", dir=settings.home.parent))
        commands["baseline_"] = Command(baseline, scratch / "home", {"LAZYHIPPO_QUERY_DAEMON": "0"})
        shutil.copytree(settings.home, scratch / "home", copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns("dagster", "*.lock", ".index-cache", "query-daemon.*"))
    daemon = start_query_daemon(executable, settings) if warm else None
    if daemon is not None:
        commands["warm_"] = Command(executable, settings.home, {"LAZYHIPPO_QUERY_DAEMON": "30"}, daemon.pid)
    try:
        return _cli_walls(commands, settings.namespace, questions, runs)
    finally:
        if daemon is not None:
            daemon.terminate()
            daemon.wait(30)
        if baseline:
            shutil.rmtree(scratch, ignore_errors=True)


@dataclass(frozen=True)
class Command:
    """One build's `lazyhippo query` in `_cli_walls`: its executable, home, extra variables and the daemon that
    answers it (whose CPU time is measured too)."""

    executable: Path
    home: Path
    env: dict[str, str]
    daemon_pid: int | None = None


def start_query_daemon(executable: Path, settings: Settings, seconds: float = 300) -> subprocess.Popen:
    """`lazyhippo daemon` of the home, once it advertises itself (it has loaded Dagster's job and the index)."""
    advert = settings.home / "query-daemon.json"
    daemon = subprocess.Popen([str(executable), "daemon", "--home", str(settings.home), "--namespace",
                               settings.namespace, "--idle-minutes", "30"],
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if json.loads(advert.read_text()).get("pid") == daemon.pid:
                return daemon
        except (OSError, ValueError):
            pass
        if daemon.poll() is not None:
            raise RuntimeError(f"`lazyhippo daemon` ended ({daemon.returncode}): {daemon.stderr.read()[-500:]}")
        time.sleep(0.1)
    daemon.kill()
    raise RuntimeError(f"`lazyhippo daemon` did not start within {seconds:.0f} s")


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) a running process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _cli_walls(commands: dict[str, Command], namespace: str, questions: Sequence[dict], runs: int) -> dict:
    """`run_cli_latency`'s measurements: `commands` maps a figure prefix to the command it times."""
    import resource

    walls: dict[str, list[float]] = {prefix: [] for prefix in commands}
    cpus: dict[str, list[float]] = {prefix: [] for prefix in commands}
    served: dict[str, list[float]] = {prefix: [] for prefix, c in commands.items() if c.daemon_pid}
    load_before = os.getloadavg()[0]
    for i in range(runs + 1):
        for prefix, cmd in commands.items():
            command = [str(cmd.executable), "query", "--home", str(cmd.home), "--namespace", namespace,
                       "--json", questions[i % len(questions)]["question"]]
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            daemon_cpu = _process_cpu(cmd.daemon_pid) if cmd.daemon_pid else 0.0
            t0 = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=child_environment(**cmd.env))
            walls[prefix].append(time.perf_counter() - t0)
            now = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus[prefix].append(now.ru_utime - used.ru_utime + now.ru_stime - used.ru_stime)
            if done.returncode:
                raise RuntimeError(f"`{' '.join(command[:-1])}` failed ({done.returncode}): {done.stderr.strip()[-500:]}")
            if cmd.daemon_pid:
                served[prefix].append(_process_cpu(cmd.daemon_pid) - daemon_cpu)
                if not served[prefix][-1]:
                    raise RuntimeError(f"`{' '.join(command[:-1])}` did not go through the query daemon")
    out = {"n": runs, "load_before": load_before, "load_after": os.getloadavg()[0]}
    for prefix in commands:
        w, c = walls[prefix], cpus[prefix]
        out.update({f"{prefix}first_ms": w[0] * 1000, f"{prefix}p50_ms": percentile_ms(w[1:], 50),
                    f"{prefix}p95_ms": percentile_ms(w[1:], 95), f"{prefix}cpu_p50_ms": percentile_ms(c[1:], 50)})
    for prefix, cpu in served.items():
        out[f"{prefix}daemon_cpu_p50_ms"] = percentile_ms(cpu[1:], 50)
    if "baseline_" in commands:
        out["p50_ratio"] = out["p50_ms"] / max(out["baseline_p50_ms"], 1e-9)
        out["cpu_p50_ratio"] = out["cpu_p50_ms"] / max(out["baseline_cpu_p50_ms"], 1e-9)
    return out


def query_config(assignments: Sequence[str]):
    """A QueryConfig from `section.field=value` strings (the value as JSON, else as text), e.g.
    `graph.synonym_min_score=0.6`, or `field=value` for a top-level field (`subquestions=true`); None without any.
    Unknown sections or fields raise ValueError."""
    from lazyhippo.query import QueryConfig

    if not assignments:
        return None
    sections: dict[str, dict] = {}
    for item in assignments:
        key, sep, raw = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not section:
            raise ValueError(f"{item!r}: expected section.field=value, e.g. graph.synonym_min_score=0.6")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        if dot:
            sections.setdefault(section, {})[name] = value
        elif isinstance(getattr(QueryConfig(), section, None), (bool, int, float)):
            sections[section] = value
        else:
            raise ValueError(f"{item!r}: {section} is not a top-level setting (expected section.field=value)")
    try:
        return QueryConfig().with_(**sections)
    except (AttributeError, TypeError) as exc:
        raise ValueError(f"{', '.join(assignments)}: {exc}") from None
