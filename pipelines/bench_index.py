"""`lazyhippo bench index`: the index job with 1 and with N worker processes, then the time to bring the index
up to date after one changed and after one deleted document. Runs through Dagster (the code path users run),
and reports what Dagster itself costs: the event-log rows of each run and the share of its wall time spent
outside any step (launch, planning, event writes between steps)."""

from __future__ import annotations

import json
import os
import shutil
import time
from itertools import islice
from pathlib import Path
from typing import Callable

import dagster as dg
import polars as pl

from lazyhippo_dagster.runner import index_run, instance_for, run_config

SHARD_ROWS = 1000  # documents per JSONL file of a benchmark's source folder

PER_DOCUMENT_STEPS = ("documents", "extractions.")


def _per_document_seconds(instance: dg.DagsterInstance, run_ids: list[str]) -> float:
    """First start to last success of the per-document steps of the runs (0 when none ran: a removal alone)."""
    kinds = (dg.DagsterEventType.STEP_START, dg.DagsterEventType.STEP_SUCCESS)
    events = pl.DataFrame([(run_id, r.dagster_event.step_key, kind.value, r.timestamp) for run_id in run_ids
                           for kind in kinds for r in instance.all_logs(run_id, of_type=kind)],
                          schema={"run": pl.String, "step": pl.String, "kind": pl.String, "at": pl.Float64}, orient="row")
    steps = (events.filter(pl.any_horizontal([pl.col("step").str.starts_with(p) for p in PER_DOCUMENT_STEPS]))
             .pivot(on="kind", index=["run", "step"], values="at", on_columns=[k.value for k in kinds],
                    aggregate_function="last").drop_nulls())
    return steps[kinds[1].value].max() - steps[kinds[0].value].min() if steps.height else 0.0


def step_spans(instance: dg.DagsterInstance, run_ids: list[str]) -> dict[str, tuple[float, float]]:
    """Each step's start and end (wall-clock times) in the runs; mapped extraction batches count as one step
    `extractions.extract_batch[*]`, from the first start to the last end."""
    spans: dict[str, tuple[float, float]] = {}
    ends = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)
    for run_id in run_ids:
        starts: dict[str, float] = {}
        for e in instance.all_logs(run_id):
            if not e.is_dagster_event or e.dagster_event.step_key is None:
                continue
            key = e.dagster_event.step_key
            name = key.split("[")[0] + ("[*]" if "[" in key else "")
            if e.dagster_event.event_type == dg.DagsterEventType.STEP_START:
                starts[key] = e.timestamp
            elif e.dagster_event.event_type in ends and key in starts:
                start, end = spans.get(name, (starts[key], e.timestamp))
                spans[name] = (min(start, starts[key]), max(end, e.timestamp))
    return spans


def dagster_cost(instance: dg.DagsterInstance, run_id: str, seconds: float) -> dict:
    """The run's event-log rows, and the share of `seconds` (its wall time) covered by no step: steps that run
    side by side count once (the union of their start-to-end spans)."""
    ends = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)
    logs = instance.all_logs(run_id)
    starts = {e.dagster_event.step_key: e.timestamp for e in logs if e.is_dagster_event
              and e.dagster_event.event_type == dg.DagsterEventType.STEP_START}
    spans = sorted((starts[e.dagster_event.step_key], e.timestamp) for e in logs if e.is_dagster_event
                   and e.dagster_event.event_type in ends and e.dagster_event.step_key in starts)
    covered, reach = 0.0, float("-inf")
    for start, end in spans:
        covered += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return {"event_rows": len(logs), "outside_steps_share": max(0.0, 1 - covered / seconds) if seconds else 0.0}


def _timed_index(home: Path, source: Path, workers: int | None, namespace: str = "bench",
                 instance: dg.DagsterInstance | None = None, progress: Callable[[str], None] | None = None) -> dict:
    """Wall time of the whole `index` chain and of its per-document steps (first start to last end); `workers`
    None is the CLI's default in-process run, a number the multiprocess executor with that many processes. The
    run goes to `instance`, by default the home's own (SQLite); `progress` gets a line as each step ends."""
    config = run_config({"lazyhippo": {"home": str(home), "source": str(source)}})
    tags = {"lazyhippo/bench": f"index-{workers or 'in-process'}"}
    instance = instance or instance_for(home)
    t0 = time.perf_counter()

    def on_step(step: str, state: str) -> None:  # a line per step, so a run of an hour shows where it is in a log
        if state != "started":
            progress(f"  {step} {state} at {time.perf_counter() - t0:,.0f} s")

    result = index_run(instance, home, config, tags, namespace, workers, on_step if progress else None)
    seconds = time.perf_counter() - t0
    if not result.success:
        raise RuntimeError(f"bench index run {result.run_id} failed (see `dagster dev`)")
    per_doc = _per_document_seconds(instance, result.run_ids)
    return {"seconds": seconds, "per_document_seconds": per_doc, "run_id": result.run_id, "run_ids": result.run_ids,
            **dagster_cost(instance, result.run_id, seconds)}


def _rewrite_jsonl(path: Path, edit: Callable[[list[dict]], list[dict]]) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in edit(rows)))
    tmp.replace(path)


def write_jsonl_source(source: Path, lines: list[str]) -> Path:
    """JSONL rows written into the folder `source` as files of SHARD_ROWS rows (a large corpus stays under the
    source's file size limit, and an edit rewrites one file); returns the first file."""
    for start in range(0, len(lines), SHARD_ROWS):
        (source / f"corpus-{start // SHARD_ROWS:04d}.jsonl").write_text("\n".join(lines[start:start + SHARD_ROWS]) + "\n")
    return source / "corpus-0000.jsonl"


def _fresh_source(corpus: Path, workdir: Path, limit: int | None) -> tuple[Path, Path, list[str]]:
    """An emptied `workdir` with the first `limit` rows of `corpus` as the source folder."""
    if workdir.exists():
        shutil.rmtree(workdir)
    source = workdir / "source"
    source.mkdir(parents=True)
    with corpus.open() as f:
        lines = [line.rstrip("\n") for line in islice((line for line in f if line.strip()), limit)]
    return source, write_jsonl_source(source, lines), lines


def run_cluster_index_bench(corpus: Path, workdir: Path, workers: int = 2, limit: int | None = None,
                            progress: Callable[[str], None] = print) -> dict:
    """Full index through a loopback cluster (`lazyhippo cluster up`) with 1 and with `workers` Celery workers:
    the per-document stages' speedup."""
    import uuid

    from lazyhippo.stores.minio import MinioObjectStore
    from lazyhippo_dagster import cluster

    source, _, lines = _fresh_source(corpus, workdir, limit)
    out: dict = {"corpus": str(corpus), "documents": len(lines), "workers": workers, "executor": "celery"}
    for n in (1, workers):
        progress(f"full index through the cluster with {n} Celery worker(s)")
        c = cluster.up(workdir / f"cluster_{n}", workers=n)
        namespace = f"bench-{uuid.uuid4().hex[:8]}"
        try:
            t0 = time.perf_counter()
            runs = cluster.index(c, namespace, str(source))
            seconds = time.perf_counter() - t0
            if not all(r.is_success for r in runs):
                raise RuntimeError(f"bench cluster runs {[r.run_id for r in runs]} did not all succeed")
            instance = c.instance()
            per_doc = _per_document_seconds(instance, [r.run_id for r in runs])
            out[f"full_{n}"] = {"seconds": seconds, "run_id": runs[-1].run_id, "per_document_seconds": per_doc}
        finally:
            cluster.down(c.root)
            MinioObjectStore.from_env().delete_prefix(f"{namespace}/")
    out["speedup_per_document"] = out["full_1"]["per_document_seconds"] / out[f"full_{workers}"]["per_document_seconds"]
    return out


def bench_postgres_instance(workdir: Path) -> dg.DagsterInstance:
    """A Dagster instance on the cluster's PostgreSQL (`lazyhippo cluster`'s dagster.yaml, the login from the
    services credentials), its folder under `workdir`."""
    from lazyhippo_dagster.cluster import instance_yaml, postgres_instance as instance_at

    dagster_home = workdir / "postgres" / "dagster"
    dagster_home.mkdir(parents=True, exist_ok=True)
    (dagster_home / "dagster.yaml").write_text(instance_yaml())
    return instance_at(dagster_home)


def run_index_bench(corpus: Path, workdir: Path, workers: int = 2, limit: int | None = None,
                    progress: Callable[[str], None] = print, storage: str = "sqlite") -> dict:
    """Each full index starts from an empty home (no extraction cache). With `workers` > 1, 1 vs N processes
    both run on the multiprocess executor (like for like); the CLI's in-process full index and the updates run
    in-process, as `lazyhippo index` does. `storage` "postgres" records the in-process runs in a PostgreSQL
    instance instead of the home's SQLite one (the multiprocess runs, whose processes rebuild the instance from
    its yaml, keep SQLite)."""
    source, data, lines = _fresh_source(corpus, workdir, limit)
    out: dict = {"corpus": str(corpus), "documents": len(lines), "workers": workers, "storage": storage}
    instance = bench_postgres_instance(workdir) if storage == "postgres" else None
    for n in ((1, workers) if workers > 1 else ()):
        progress(f"full index with {n} worker process(es)")
        out[f"full_{n}"] = _timed_index(workdir / f"home_{n}", source, n, progress=progress)
    progress("full index in-process (the CLI default)")
    out["full_in_process"] = _timed_index(workdir / "home_in_process", source, None, instance=instance, progress=progress)
    home = workdir / "home_in_process"
    progress("one changed document")
    _rewrite_jsonl(data, lambda rows: [{**r, "text": r["text"] + " (revised)"} if i == 0 else r for i, r in enumerate(rows)])
    out["changed_one"] = _timed_index(home, source, None, instance=instance)
    progress("one deleted document")
    _rewrite_jsonl(data, lambda rows: rows[1:])
    out["deleted_one"] = _timed_index(home, source, None, instance=instance)
    if workers > 1:
        full, par = out["full_1"], out[f"full_{workers}"]
        out["speedup_total"] = full["seconds"] / par["seconds"]
        out["speedup_per_document"] = full["per_document_seconds"] / par["per_document_seconds"]
    base = out["full_in_process"]["seconds"]
    out["changed_share_of_full"] = out["changed_one"]["seconds"] / base
    out["deleted_share_of_full"] = out["deleted_one"]["seconds"] / base
    return out


def index_table(result: dict) -> pl.DataFrame:
    """One row per timed run: the whole time, the per-document stages, the rest (graph-wide stages, overhead),
    and Dagster's own cost: event-log rows and the share of the run outside every step."""
    runs = [r for r in ("full_1", f"full_{result['workers']}", "full_in_process", "changed_one", "deleted_one") if r in result]
    return (pl.DataFrame([{"run": r, "seconds": result[r]["seconds"], "per-document stages s": result[r]["per_document_seconds"],
                           "event rows": result[r]["event_rows"], "outside steps": result[r]["outside_steps_share"]}
                          for r in runs])
            .with_columns((pl.col("seconds") - pl.col("per-document stages s")).alias("graph-wide stages and run overhead s"))
            .with_columns(pl.exclude("run", "event rows", "outside steps").round(2), pl.col("outside steps").round(3))
            .select("run", "seconds", "per-document stages s", "graph-wide stages and run overhead s", "event rows",
                    "outside steps"))


def run_stage_bench(corpus: Path, workdir: Path, progress: Callable[[str], None] = print) -> dict:
    """A full index of `corpus` (a JSONL file or a folder) from an empty home through the library entry point
    (`run_index`, no Dagster), with the offline defaults: per stage its wall seconds and the CPU seconds of the
    process tree (the extraction workers included), then the whole run's MB a minute (MB of the source files)
    and the host's load average at start and end: on a shared host, CPU seconds compare better than wall time."""
    from lazyhippo.index import STAGE_NAMES, run_index
    from lazyhippo.settings import Settings
    from lazyhippo_dagster.bench_process import TreeRss

    if workdir.exists():
        shutil.rmtree(workdir)
    files = [corpus] if corpus.is_file() else [f for f in corpus.rglob("*") if f.is_file()]
    mb = sum(f.stat().st_size for f in files) / 1e6
    settings = Settings.from_env().with_(home=(workdir / "home").resolve(), source=str(corpus.resolve()))
    marks: list[float] = []
    load = os.getloadavg()
    progress(f"full index of {corpus} ({mb:.2f} MB) through run_index")
    with TreeRss() as tree:
        t0 = time.perf_counter()
        out = run_index(settings, run_id="bench", progress=lambda stage, i, n: marks.append(tree.cpu_seconds())
                        if stage == "index" else None)
        seconds = time.perf_counter() - t0
    cpu = [b - a for a, b in zip(marks, marks[1:])]
    stages = {name: {"seconds": out["seconds"][name], "cpu_seconds": round(c, 1)} for name, c in zip(STAGE_NAMES, cpu)}
    stages["publish and rest"] = {"seconds": round(seconds - sum(out["seconds"].values()), 2), "cpu_seconds": None}
    return {"corpus": str(corpus), "mb": round(mb, 6), "seconds": round(seconds, 2), "mb_per_minute": round(mb / seconds * 60, 2),
            "cpu_seconds": round(marks[-1] - marks[0], 1), "peak_rss_mb": round(tree.peak / 1e6),
            "load_start": [round(x, 1) for x in load], "load_end": [round(x, 1) for x in os.getloadavg()], "stages": stages}


def stage_table(result: dict) -> pl.DataFrame:
    """One row per stage, and the whole run: wall seconds, process-tree CPU seconds and MB a minute."""
    rows = [{"stage": name, **v, "MB a minute": None} for name, v in result["stages"].items()]
    rows.append({"stage": "whole run", "seconds": result["seconds"], "cpu_seconds": result["cpu_seconds"],
                 "MB a minute": result["mb_per_minute"]})
    return pl.DataFrame(rows, schema={"stage": pl.String, "seconds": pl.Float64, "cpu_seconds": pl.Float64,
                                      "MB a minute": pl.Float64})
