"""`lazyhippo` command line: index, status, services (query and bench join as they land)."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lazyhippo.config import REPO_ROOT, SAMPLE_CORPUS, Settings
from lazyhippo.warehouse import TABLES, counts

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(stderr=True)

HomeOpt = typer.Option(None, "--home", envvar="LAZYHIPPO_HOME", help="Index folder (default ./.lazyhippo).")
NsOpt = typer.Option("default", "--namespace", "-n", envvar="LAZYHIPPO_NAMESPACE", help="Knowledge base name.")


def _home(home: Optional[Path]) -> Path:
    return (home or Path(".lazyhippo")).resolve()


def _run(job: str, home: Path, resources: dict, ops: dict | None = None):
    from .runner import execute, run_config

    tag = {"lazyhippo/cli_run": uuid.uuid4().hex}
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as bar:
        task = bar.add_task(f"{job}: starting", total=None)

        def on_step(step: str, done: int, total: int) -> None:
            bar.update(task, total=total, completed=done, description=f"{job}: {step} done")

        result = execute(job, home, run_config(resources, ops), on_step, tags=tag)
    if not result.success:
        for event in result.all_events:
            if event.is_step_failure:
                console.print(f"[red]{event.step_key} failed:[/red] {event.step_failure_data.error.message.strip()}")
        raise typer.Exit(1)
    console.print(f"run {result.run_id} succeeded (visible in `dagster dev`, DAGSTER_HOME={os.environ['DAGSTER_HOME']})")
    return result


@app.command()
def index(path: Optional[Path] = typer.Argument(None, help="Folder or file to index (default: the sample corpus)."),
          home: Optional[Path] = HomeOpt, namespace: str = NsOpt,
          graph_store: str = typer.Option("embedded", envvar="LAZYHIPPO_GRAPH_STORE", help="embedded | neo4j"),
          object_store: str = typer.Option("local", envvar="LAZYHIPPO_OBJECT_STORE", help="local | minio"),
          extractor: str = typer.Option("nlp", envvar="LAZYHIPPO_EXTRACTOR", help="nlp | llm"),
          chunk_size: int = typer.Option(256), chunk_overlap: int = typer.Option(32),
          knn_top_k: int = typer.Option(10), knn_cutoff: float = typer.Option(0.60),
          community_algorithm: str = typer.Option("leiden", help="leiden | louvain")) -> None:
    """Materialize every indexing asset through Dagster, with a progress display."""
    root = _home(home)
    source = (path or SAMPLE_CORPUS).resolve()
    if not source.exists():
        console.print(f"[red]error:[/red] {source} does not exist")
        raise typer.Exit(2)
    _run("index", root, {
        "lazyhippo": {"home": str(root), "namespace": namespace, "source": str(source), "extractor": extractor,
                      "chunk_size": chunk_size, "chunk_overlap": chunk_overlap, "knn_top_k": knn_top_k,
                      "knn_cutoff": knn_cutoff, "community_algorithm": community_algorithm},
        "graph_store": {"kind": graph_store}, "object_store": {"kind": object_store},
    })
    status(home=root, namespace=namespace, as_json=False)


@app.command()
def status(home: Optional[Path] = HomeOpt, namespace: str = NsOpt,
           as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON.")) -> None:
    """Row counts per table for one namespace."""
    figures = counts(Settings(home=_home(home), namespace=namespace))
    if as_json:
        print(json.dumps(figures))
        return
    table = Table(title=f"lazyhippo index: namespace {namespace!r} in {_home(home)}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name in TABLES:
        table.add_row(name, str(figures[name]))
    Console().print(table)


@app.command(context_settings={"allow_extra_args": True})
def services(action: str = typer.Argument(..., help="install | start | stop | status"),
             service: Optional[str] = typer.Argument(None, help="neo4j | minio (default both)")) -> None:
    """Install/start/stop the Neo4j+GDS and MinIO servers on loopback (scripts/services.sh)."""
    cmd = ["bash", str(REPO_ROOT / "scripts" / "services.sh"), action] + ([service] if service else [])
    raise typer.Exit(subprocess.call(cmd))


if __name__ == "__main__":
    app()
