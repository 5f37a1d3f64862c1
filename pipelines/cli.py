"""`lazyhippo`: index a folder into a knowledge graph through Dagster, query it with citations, keep it current
(delete, merge, export), serve it over HTTP and MCP, and measure it (bench)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from lazyhippo.logs import configure_logging
from lazyhippo.models.embedders import PROFILES
from lazyhippo.serve.chat import (CommunitiesOpt, DampingOpt, GroupOpt, HubWeightOpt, KnnThresholdOpt, LexicalWeightOpt,
                                  MaxRelatedOpt, MultiHopOpt, RerankOpt, RerankTopNOpt, SelectionOpt, SubquestionsOpt, chat,
                                  print_usage, query_options, run_usage)
from lazyhippo.settings import INDEX_MODES, SAMPLE_CORPUS, MissingCredentials, Settings, environment
from lazyhippo.stores.namespaces import resolve_settings
from lazyhippo.stores.warehouse import TABLES, IndexIncomplete, counts, has_chunks, index_notice
from lazyhippo_dagster.interrupts import restore_interrupts
from lazyhippo_dagster.options import (NothingToIndex, OptionError, check_index_options, check_namespace_option,
                                       check_query_options, resolutions_list)

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)


SERVED_RUN: dict[str, str | None] = {"run_id": None}  # the id a server chose for this process's Dagster run
START_DAEMON = False  # set by the `lazyhippo` entry point: a query run here starts the home's warm daemon


@app.callback()
def _main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Also print the libraries' notices, warnings "
                                                                      "and debug logs [$LAZYHIPPO_VERBOSE]."),
          run_id: Optional[str] = typer.Option(None, "--run-id", hidden=True,
                                               help="The id of the Dagster run (a server's run, chosen up front).")) -> None:
    restore_interrupts()  # a CLI started in the background (pipelines/interrupts.py)
    SERVED_RUN["run_id"] = run_id
    if verbose:
        os.environ.setdefault("LAZYHIPPO_VERBOSE", "1")  # worker processes and servers started from here inherit it
    try:
        env = environment()
    except ValueError as exc:  # a malformed variable: one line naming it
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2)
    configure_logging(env.verbose)


console = Console(stderr=True)

def _env_home(value: Optional[Path]) -> Path:
    return Settings.from_env(home=value).home


def _env_namespace(value: Optional[str]) -> str:
    return Settings.from_env().namespace if value is None else value  # "" stays "": refused as a bad name


# unset options fall back to the LAZYHIPPO_* variables through Settings.from_env, the one reader of the environment
HomeOpt = typer.Option(None, "--home", callback=_env_home, help="Index folder [$LAZYHIPPO_HOME or ./.lazyhippo].")
NsOpt = typer.Option(None, "--namespace", "-n", callback=_env_namespace,
                     help="Knowledge base name [$LAZYHIPPO_NAMESPACE or default].")


IndexModeOpt = Enum("IndexModeOpt", {m: m for m in INDEX_MODES}, type=str)  # a typed choice for typer


def _checked(check, *args, **kwargs) -> None:
    """Options are validated before any run: a bad value is one line and exit code 2."""
    try:
        check(*args, **kwargs)
    except OptionError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def _refused(message: str, operation: str, home: Path, namespace: str, tags: dict[str, str]) -> None:
    """Bad input found before the run started: one line, exit code 2; a server's run is recorded failed with it."""
    console.print(f"[red]error:[/red] {escape(message)}")
    if SERVED_RUN["run_id"]:
        from lazyhippo_dagster.runner import instance_for
        from lazyhippo_dagster.served_runs import record_unexecuted

        import dagster as dg

        record_unexecuted(instance_for(home), SERVED_RUN["run_id"], operation, namespace, tags,
                          dg.DagsterRunStatus.FAILURE, message)
    raise typer.Exit(2)


@contextmanager
def _unreadable_source(home: Path, namespace: str, tags: dict[str, str]):
    """A source with files but no readable document (and nothing indexed yet) is bad input: its files and
    reasons, exit code 2, and no run executed."""
    try:
        yield
    except NothingToIndex as exc:
        _refused(str(exc), "index", home, namespace, tags)


def _terminal() -> Console:
    """A console on a duplicate of the real stderr: Dagster redirects fds 1 and 2 into its compute logs while a
    step runs, which froze a display drawn on them."""
    try:
        return Console(file=os.fdopen(os.dup(sys.stderr.fileno()), "w", buffering=1), stderr=True)
    except (AttributeError, OSError, ValueError):  # no real stderr (tests): draw on the usual one
        return console


def _run(job: str, home: Path, resources: dict, ops: dict | None = None, namespace: str | None = None,
         workers: int = 1, tags: dict[str, str] | None = None):
    from lazyhippo_dagster.runner import execute, failure_reason, run_config

    tag = {"lazyhippo/cli_run": uuid.uuid4().hex, **(tags or {})}
    if job == "query":  # one short step: no progress display, nor polling the run's events beside it
        result = execute(job, home, run_config(resources, ops), tags=tag, namespace=namespace)
    else:
        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TimeElapsedColumn(),
                      console=_terminal(), transient=False) as bar:
            tasks: dict[str, int] = {}

            def on_step(step: str, state: str) -> None:
                if step not in tasks:
                    tasks[step] = bar.add_task(f"{job}: {step}", total=None)
                if state != "started":
                    bar.update(tasks[step], total=1, completed=1, description=f"{job}: {step} {state}")
                    bar.stop_task(tasks[step])

            result = execute(job, home, run_config(resources, ops), on_step, tags=tag, namespace=namespace,
                             workers=workers, run_id=SERVED_RUN["run_id"])
    if not result.success:
        for event in result.all_events:
            if event.is_step_failure:
                console.print(f"[red]{event.step_key} failed:[/red] {event.step_failure_data.error.message.strip()}")
        cause = failure_reason(result.all_events)
        if cause:
            console.print(f"[red]root cause:[/red] {cause}")
        raise typer.Exit(1)
    console.print(f"run {result.run_id} succeeded (visible in `dagster dev`, DAGSTER_HOME={os.environ['DAGSTER_HOME']})")
    return result


def _notice(settings: Settings) -> None:
    """Say when the latest index run of the namespace is unfinished, failed or was killed; stop when nothing
    complete exists."""
    try:
        notice = index_notice(settings)
    except IndexIncomplete as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if notice:
        console.print(f"[yellow]note:[/yellow] {notice}")


@app.command()
def index(path: Optional[Path] = typer.Argument(None, help="Folder or file to index (default: the sample corpus)."),
          home: Path = HomeOpt, namespace: str = NsOpt,
          graph_store: Optional[str] = typer.Option(None, help="embedded | neo4j"),
          object_store: Optional[str] = typer.Option(None, help="local | minio"),
          extractor: Optional[str] = typer.Option(None, help="nlp | llm"),
          embedder: Optional[str] = typer.Option(None, help=f"{' | '.join(PROFILES)} [{Settings().embedder}]"),
          chunk_size: Optional[int] = typer.Option(None, help="Tokens per chunk [256]."),
          chunk_overlap: Optional[int] = typer.Option(None, help="Tokens shared by neighbouring chunks [32]."),
          relations_per_chunk: Optional[int] = typer.Option(
              None, help=f"Co-occurrence relations a chunk adds to the graph, strongest first; 0: all "
                         f"[{Settings().relations_per_chunk}]."),
          knn_top_k: Optional[int] = typer.Option(None, help=f"Similar entities kept per entity [{Settings().knn_top_k}]."),
          knn_cutoff: Optional[float] = typer.Option(None, help="Cosine an entity pair needs [0.60]."),
          community_algorithm: Optional[str] = typer.Option(None, help="leiden | louvain [leiden]"),
          community_resolutions: Optional[str] = typer.Option(
              None, help="Community levels coarse to fine: increasing resolutions, comma-separated [0.25,0.5,1.0]."),
          knn_structural: Optional[str] = typer.Option(
              None, help="FastRP structural vectors in the entity KNN (neo4j only): off | concat | replace [off]"),
          workers: int = typer.Option(1, min=1, help="Worker processes: >1 runs the multiprocess executor, "
                                                     "extraction batches in parallel (docs/scale-out.md)."),
          mode: IndexModeOpt = typer.Option("replace", "--mode", help="replace: the namespace becomes exactly this "
                                            "source (documents it lacks are dropped); add: nothing is dropped.")) -> None:
    """Index through Dagster: one `index` run of the namespace (documents added or changed are read again, by
    content hash), with a progress display. Unset options keep what the namespace was last indexed with."""
    root = home
    source = (path or SAMPLE_CORPUS).resolve()
    _checked(check_index_options, source, namespace, chunk_size=chunk_size, chunk_overlap=chunk_overlap,
             knn_top_k=knn_top_k, knn_cutoff=knn_cutoff, community_algorithm=community_algorithm,
             relations_per_chunk=relations_per_chunk, graph_store=graph_store, object_store=object_store,
             extractor=extractor, embedder=embedder,
             community_resolutions=community_resolutions, knn_structural=knn_structural)
    from lazyhippo_dagster.served_runs import MODE_TAG, OPERATION_TAG

    tags = {OPERATION_TAG: "index", MODE_TAG: mode.value}
    with _unreadable_source(root, namespace, tags):
        result = _run("index", root, {
            "lazyhippo": {"home": str(root), "namespace": namespace, "source": str(source), "extractor": extractor,
                          "embedder": embedder, "chunk_size": chunk_size, "chunk_overlap": chunk_overlap,
                          "relations_per_chunk": relations_per_chunk, "knn_top_k": knn_top_k,
                          "knn_cutoff": knn_cutoff, "community_algorithm": community_algorithm,
                          "mode": mode.value, "community_resolutions": resolutions_list(community_resolutions),
                          "knn_structural": knn_structural},
            "graph_store": {"kind": graph_store}, "object_store": {"kind": object_store},
        }, namespace=namespace, workers=workers, tags=tags)
    change = result.change
    console.print(f"documents: {change.added} added, {change.changed} changed, {change.removed} removed, "
                  f"{change.failed} failed (mode {mode.value})")
    status(home=root, namespace=namespace, as_json=False)
    print_usage([u for run_id in result.run_ids for u in run_usage(Settings(home=root, namespace=namespace), run_id)], Console())


@app.command()
def status(home: Path = HomeOpt, namespace: str = NsOpt,
           as_json: bool = typer.Option(False, "--json", help="Print the counts as JSON.")) -> None:
    """Row counts per table for one namespace (of its last complete index)."""
    _checked(check_namespace_option, namespace)
    settings = Settings(home=home, namespace=namespace)
    _notice(settings)
    figures = counts(settings)
    if as_json:
        print(json.dumps(figures))
        return
    table = Table(title=f"lazyhippo index: namespace {namespace!r} in {home}")
    table.add_column("table")
    table.add_column("rows", justify="right")
    for name in TABLES:
        table.add_row(name, str(figures[name]))
    Console().print(table)


def _warm(settings: Settings, options) -> None:
    """Load the index, embedder and tokenizer the query run reads in a thread, while Dagster sets up its
    instance and starts the run: those wait on SQLite and the disk, which leaves the interpreter free, and the
    run's step finds them in this process's caches. An error is left for the run to meet and report."""
    from lazyhippo.query.answer import warm

    def target() -> None:
        try:
            warm(options.settings(settings), options.config())
        except Exception:  # the run reads the same index and reports why it cannot
            pass

    threading.Thread(target=target, name="warm query engine", daemon=True).start()


@app.command("query")
def query_cmd(question: str = typer.Argument(..., help="The question."),
              route: str = typer.Option("auto", help="auto | local | global"),
              top_k: int = typer.Option(8, "--top-k"), budget: int = typer.Option(32000, help="Context token budget."),
              as_json: bool = typer.Option(False, "--json", help="Print the full result object."),
              home: Path = HomeOpt, namespace: str = NsOpt,
              graph_store: Optional[str] = typer.Option(None, help="embedded | neo4j"),
              rerank: Optional[str] = RerankOpt, rerank_top_n: Optional[int] = RerankTopNOpt,
              chunk_selection: Optional[str] = SelectionOpt, max_related_chunks: Optional[int] = MaxRelatedOpt,
              group_neighbours: Optional[bool] = GroupOpt, damping: Optional[float] = DampingOpt,
              communities: Optional[int] = CommunitiesOpt, knn_threshold: Optional[float] = KnnThresholdOpt,
              hub_weight: Optional[float] = HubWeightOpt, lexical_weight: Optional[float] = LexicalWeightOpt,
              multi_hop: Optional[int] = MultiHopOpt, subquestions: Optional[bool] = SubquestionsOpt) -> None:
    """Launch the Dagster `query` job and print the answer with numbered citations."""
    root = home
    _checked(check_query_options, question, namespace, route=route, top_k=top_k, budget=budget, graph_store=graph_store)
    options = query_options(rerank=rerank, rerank_top_n=rerank_top_n, chunk_selection=chunk_selection,
                            max_related_chunks=max_related_chunks, group_neighbours=group_neighbours, damping=damping,
                            communities=communities, knn_threshold=knn_threshold, hub_weight=hub_weight,
                            lexical_weight=lexical_weight, multi_hop=multi_hop, subquestions=subquestions)
    settings = Settings(home=root, namespace=namespace)
    _notice(settings)
    if not has_chunks(settings):
        console.print(f"[red]error:[/red] namespace {namespace!r} in {root} has no index yet: run `lazyhippo index` first")
        raise typer.Exit(2)
    _warm(resolve_settings(root, namespace), options)
    result = _run("query", root, {"lazyhippo": {"home": str(root), "namespace": namespace},
                                  "graph_store": {"kind": graph_store}},
                  ops={"answer_question": {"config": {"question": question, "route": route, "top_k": top_k,
                                                      "budget": budget, "options": options.chosen()}}},
                  namespace=namespace)
    data = result.output_for_node("answer_question")
    _print_answer(data, question, namespace, as_json)
    if START_DAEMON and not environment().verbose:  # the next query of this home is answered warm
        from lazyhippo_dagster.query_daemon import start_daemon

        start_daemon(root, namespace, environment().query_daemon_minutes)


def _print_answer(data: dict, question: str, namespace: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2))
        return
    out = Console()
    out.print(f"[bold]Q:[/bold] {question}  [dim](route {data['route']}, {data['context_tokens']} context tokens)[/dim]")
    if data["answerable"]:
        out.print(f"[bold]A:[/bold] {data['answer']}  [dim](rerank {data['diagnostics']['rerank']['status']})[/dim]")
    else:
        out.print(f"[bold]A:[/bold] nothing in namespace {namespace!r} answers this question"
                  + ("; the closest passages:" if data["closest"] else "."))
    for cite in data["citations"] or data["closest"]:
        where = " ".join(x for x in (f"§ {cite['section']}" if cite.get("section") else "",
                                     f"p. {cite['page']}" if cite.get("page") else "") if x)
        out.print(f"  [{cite['n']}] {cite['title']} {where} ({cite['chunk_id']}, {cite['source']})", markup=False)
    print_usage(data["usage"], out)


app.command("chat")(chat)


@app.command("daemon")
def daemon_cmd(home: Path = HomeOpt, namespace: str = NsOpt,
               idle_minutes: float = typer.Option(10.0, "--idle-minutes", min=0.01,
                                                  help="Exit after this many minutes without a query."),
               stop: bool = typer.Option(False, "--stop", help="End the home's daemon instead.")) -> None:
    """Keep this home's queries warm: `lazyhippo query` hands its command to this process, which runs it as the
    same Dagster run with Dagster and the index already loaded (a query started without one starts it, unless
    LAZYHIPPO_QUERY_DAEMON=0). Loopback only, with a token in the home readable by its owner."""
    from lazyhippo_dagster import query_daemon

    if stop:
        pid = query_daemon.stop(home)
        console.print(f"stopped the query daemon {pid} of {home}" if pid else f"no query daemon runs for {home}")
        return
    _checked(check_namespace_option, namespace)

    def ready() -> None:  # what a query reads first, before the first is accepted: the query job and the index
        from lazyhippo.query.answer import warm as load
        from lazyhippo_dagster.runner import job_def

        job_def("query")
        try:
            if has_chunks(Settings(home=home, namespace=namespace)):
                load(resolve_settings(home, namespace))
        except Exception as exc:  # noqa: BLE001 - each query reports what it cannot read
            console.print(f"[yellow]note:[/yellow] the index of namespace {namespace!r} was not loaded: {exc}")
        console.print(f"query daemon {os.getpid()} serves {home} (idle exit after {idle_minutes:g} min)")

    warm = typer.Typer(add_completion=False)  # `query` alone: building the whole CLI would cost every request
    warm.callback()(_main)
    warm.command("query")(query_cmd)
    try:
        query_daemon.serve(home, idle_minutes * 60, warm, ready)
    except query_daemon.AlreadyRunning as exc:
        console.print(f"[yellow]note:[/yellow] {exc}")


def _edit_then_rebuild(home: Optional[Path], namespace: str, graph_store: Optional[str], object_store: Optional[str],
                       operation: str, edit) -> None:
    """Apply `edit(settings, con, store, objects) -> (message, run tags)` to the index (a ValueError is a clear
    error that changes nothing), then rebuild the graph-wide assets through the Dagster `rebuild_graph` job."""
    from lazyhippo.stores import open_graph_store, open_object_store
    from lazyhippo.stores.warehouse import WriterSession
    from lazyhippo_dagster.served_runs import OPERATION_TAG

    root = home
    settings = Settings.from_env(home=root, namespace=namespace, graph_store=graph_store, object_store=object_store)
    store = open_graph_store(settings.graph_store)
    try:
        with WriterSession(settings, f"cli-{uuid.uuid4().hex[:8]}") as writer, writer.connect() as con:
            message, tags = edit(settings, con, store, open_object_store(settings.object_store, settings))
    except ValueError as exc:  # unknown document or entity, bad strategy
        _refused(str(exc), operation, settings.home, namespace, {OPERATION_TAG: operation})
    finally:
        store.close()
    console.print(message)
    _run("rebuild_graph", root, {"lazyhippo": {"home": str(root), "namespace": namespace},
                                 "graph_store": {"kind": graph_store}, "object_store": {"kind": object_store}},
         namespace=namespace, tags={OPERATION_TAG: operation, **tags})
    status(home=root, namespace=namespace, as_json=False)


@app.command()
def delete(documents: list[str] = typer.Argument(..., help="doc_id or source path (as in the documents table) of each document."),
           home: Path = HomeOpt, namespace: str = NsOpt,
           graph_store: Optional[str] = typer.Option(None, help="embedded | neo4j"),
           object_store: Optional[str] = typer.Option(None, help="local | minio")) -> None:
    """Remove documents (chunks, mentions, facts) and rebuild the graph from the cached extractions of the rest."""
    from lazyhippo.stages.lifecycle import remove_documents
    from lazyhippo_dagster.served_runs import REMOVED_TAG

    def edit(settings, con, store, objects) -> tuple[str, dict[str, str]]:
        deleted = remove_documents(settings, con, documents, store, objects)
        return (f"removed {len(deleted.doc_ids)} document(s), {deleted.chunks} chunks: {', '.join(deleted.sources)}",
                {REMOVED_TAG: str(len(deleted.doc_ids))})

    _edit_then_rebuild(home, namespace, graph_store, object_store, "delete", edit)


@app.command()
def merge(sources: list[str] = typer.Argument(..., help="Entities to fold (names or ids as in the entities table)."),
          into: str = typer.Option(..., "--into", help="The entity that remains (created when no entity has that name)."),
          strategy: str = typer.Option("concatenate", help="Target description: concatenate | keep_first | keep_longest "
                                       "| llm_summary (needs an LLM)"),
          home: Path = HomeOpt, namespace: str = NsOpt,
          graph_store: Optional[str] = typer.Option(None, help="embedded | neo4j"),
          object_store: Optional[str] = typer.Option(None, help="local | minio")) -> None:
    """Merge entities into one (relations redirected, self-loops dropped, duplicates combined); recorded, so every
    later index applies it again; the graph-wide assets are rebuilt through Dagster."""
    from lazyhippo.stages.merge import merge_on_neo4j, record_merge

    def edit(settings, con, store, objects) -> tuple[str, dict[str, str]]:
        done = record_merge(con, namespace, sources, into, strategy, settings.llm != "none")
        if store.name == "neo4j" and not done.created:
            merge_on_neo4j(store, namespace, done)
        new = " (a new entity)" if done.created else ""
        return f"merged {len(done.source_ids)} entit{'y' if len(done.source_ids) == 1 else 'ies'} into {done.target_name!r}{new}", {}

    _edit_then_rebuild(home, namespace, graph_store, object_store, "merge", edit)


@app.command("export")
def export_cmd(fmt: str = typer.Option("csv", "--format", help="csv | xlsx | md | parquet"),
               tables: str = typer.Option("entities,relations,chunks", help="Comma-separated tables."),
               out: Optional[Path] = typer.Option(None, "--out", help="Output folder (default ./export-<namespace>)."),
               batch_rows: int = typer.Option(5000, min=1, help="Rows per streamed batch (bounds memory)."),
               include_vectors: bool = typer.Option(False, "--include-vectors",
                                                    help="Add each row's embedding as a `vector` column (chunks, "
                                                         "entities, facts, community_summaries)."),
               home: Path = HomeOpt, namespace: str = NsOpt) -> None:
    """Write tables of one namespace as files, streamed in batches: one file per table (one sheet per table in
    lazyhippo.xlsx)."""
    from lazyhippo.stages.exports import check_request, export_tables
    from lazyhippo.stores.warehouse import connect

    names = [t.strip() for t in tables.split(",") if t.strip()]
    try:
        check_request(fmt, names)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2)
    settings = Settings.from_env(home=home, namespace=namespace)
    if not has_chunks(settings):
        console.print(f"[red]error:[/red] namespace {namespace!r} in {settings.home} has no index yet: run `lazyhippo index` first")
        raise typer.Exit(2)
    target = (out or Path(f"export-{namespace}")).resolve()
    with connect(settings, read_only=True) as con:
        try:
            done = export_tables(con, namespace, fmt, names, target, batch_rows, include_vectors)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
    for e in done:
        console.print(f"{e.table}: {e.rows} rows -> {e.path}")


@app.command()
def entity(name: str = typer.Argument(..., help="Entity name (matched loosely) or id."),
           neighbours: int = typer.Option(20, min=0, help="Neighbours to show."),
           chunks: int = typer.Option(10, min=0, help="Mentioning passages to show."),
           as_json: bool = typer.Option(False, "--json", help="Print the full result object."),
           home: Path = HomeOpt, namespace: str = NsOpt) -> None:
    """One entity: description, type, community at each level, PageRank, neighbours with their relation
    descriptions and weights, and the passages that mention it. A loose name with several candidates lists them."""
    from lazyhippo.query.entity import lookup_entity

    _checked(check_namespace_option, namespace)
    settings = Settings.from_env(home=home, namespace=namespace)
    if not has_chunks(settings):
        console.print(f"[red]error:[/red] namespace {namespace!r} in {settings.home} has no index yet: run `lazyhippo index` first")
        raise typer.Exit(2)
    try:
        found = lookup_entity(settings, name, neighbours, chunks)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(found.to_dict(), indent=2))
    out = Console()
    if found.match == "none":
        console.print(f"[red]error:[/red] no entity like {name!r} in namespace {namespace!r}")
        raise typer.Exit(1)
    if as_json:
        return
    if found.match == "ambiguous":
        out.print(f"{name!r} could be any of these (give one exactly):")
        for c in found.candidates:
            out.print(f"  {escape(c.name)} [dim]({c.type}, similarity {c.similarity:.2f}, {c.entity_id})[/dim]")
        return
    e = found.entity
    matched = f" [dim](closest to {name!r})[/dim]" if found.match == "fuzzy" else ""
    out.print(f"[bold]{escape(e.name)}[/bold] ({e.type}, {e.entity_id}){matched}")
    out.print(f"  {escape(e.description or '(no description)')}")
    out.print(f"  PageRank {e.pagerank or 0:.4f}, {e.mentions} mentions, {e.degree} relations")
    for c in e.communities:
        out.print(f"  community level {c['level']}: {c['community_id']} ({c['size']} entities) {escape(c['title'] or '')}")
    table = Table(title="neighbours")
    for col in ("entity", "edge", "weight", "description"):
        table.add_column(col)
    for n in e.neighbours:
        table.add_row(escape(n["name"]), n["relation"], f"{n['weight']:g}", escape(n["description"] or ""))
    out.print(table)
    for i, c in enumerate(e.chunks, 1):
        where = " ".join(x for x in (f"§ {c['section']}" if c.get("section") else "",
                                     f"p. {c['page']}" if c.get("page") else "") if x)
        out.print(f"  [{i}] {escape(c['title'] or '')} {where} ({c['chunk_id']}, {c['source']}; {c['mentions']} mentions)")


@app.command()
def serve(host: str = typer.Option("127.0.0.1", help="Address to bind (not loopback: LAZYHIPPO_API_KEY is required; "
                                   "docs/security.md)."),
          port: int = typer.Option(8000), home: Path = HomeOpt,
          max_body_bytes: int = typer.Option(64 * 1024, help="Largest request body accepted."),
          max_question_chars: int = typer.Option(2000), max_budget: int = typer.Option(32000, help="Largest context budget."),
          workers: int = typer.Option(1, min=1, help="Query engines: >1 runs that many engine processes, each with its "
                                      "own warm indexes (more cores, more memory), fed by one front process."),
          rerank: Optional[str] = RerankOpt, rerank_top_n: Optional[int] = RerankTopNOpt,
          chunk_selection: Optional[str] = SelectionOpt, max_related_chunks: Optional[int] = MaxRelatedOpt,
          snapshots: Optional[str] = typer.Option(None, help="s3://bucket/prefix: serve the snapshots published there "
                                                  "(pulled when their manifest changes) [$LAZYHIPPO_SNAPSHOTS]."),
          max_header_bytes: int = typer.Option(16 * 1024, min=1024, help="Largest request line and headers (431 beyond)."),
          max_headers: int = typer.Option(100, min=10, help="Most request headers (431 beyond)."),
          header_timeout: float = typer.Option(10.0, min=0.1, help="Seconds a client has to send the request line and headers."),
          body_timeout: float = typer.Option(60.0, min=0.1, help="Seconds a client has to send a body once its headers are in."),
          keep_alive_timeout: float = typer.Option(5.0, min=0.1, help="Seconds an idle keep-alive connection stays open."),
          max_connections: int = typer.Option(256, min=1, help="Open connections at once (503 beyond).")) -> None:
    """HTTP API over warm indexes (OpenAPI docs at /docs): query routes, index runs, /health and /metrics. Without
    a key it prints a token that creating and uploading need; `kg_create` reads only under LAZYHIPPO_SOURCE_ROOTS."""
    from lazyhippo.serve.app import Access, Limits
    from lazyhippo.serve.app import serve as run_server

    if snapshots:
        from lazyhippo.stores.snapshots import parse_uri

        try:
            parse_uri(snapshots)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
        os.environ["LAZYHIPPO_SNAPSHOTS"] = snapshots  # the server's index pool (and its engine processes) read it

    try:
        Access.for_host(environment(), host)
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2)
    root = home
    settings = Settings.from_env(home=root, rerank=rerank, rerank_top_n=rerank_top_n, chunk_selection=chunk_selection,
                                 max_related_chunks=max_related_chunks)
    if not settings.db_path.exists():
        console.print(f"[yellow]note:[/yellow] no index in {root} yet: queries answer 404 until `POST /api/kg/create` ran")
    console.print(f"serving {root} on http://{host}:{port} (docs at /docs)")
    _register_runs()
    run_server(settings, host, port, Limits(max_body_bytes=max_body_bytes, max_question_chars=max_question_chars,
                                            max_budget=max_budget, max_header_bytes=max_header_bytes,
                                            max_headers=max_headers, header_seconds=header_timeout,
                                            body_seconds=body_timeout, idle_seconds=keep_alive_timeout,
                                            max_connections=max_connections), workers)


def _register_runs() -> None:
    """The server's runs are Dagster runs of the home's instance (the engine is handed them: it imports no Dagster)."""
    from lazyhippo.serve.runs import use_run_records
    from lazyhippo_dagster.served_runs import ServedRuns

    use_run_records(ServedRuns)


@app.command("mcp")
def mcp_cmd(home: Path = HomeOpt, rerank: Optional[str] = RerankOpt, rerank_top_n: Optional[int] = RerankTopNOpt,
            chunk_selection: Optional[str] = SelectionOpt, max_related_chunks: Optional[int] = MaxRelatedOpt) -> None:
    """MCP server over stdio (official mcp SDK): retrieve, answer, entity, delete, merge, run, export and namespaces tools."""
    from lazyhippo.serve.mcp import run_stdio

    _register_runs()
    run_stdio(Settings.from_env(home=home, rerank=rerank, rerank_top_n=rerank_top_n, chunk_selection=chunk_selection,
                                max_related_chunks=max_related_chunks))


bench = typer.Typer(help="Benchmarks: retrieval quality against gold passages, query latency and serving load, index time.", no_args_is_help=True)
app.add_typer(bench, name="bench")
cluster_app = typer.Typer(no_args_is_help=True, help="A Dagster deployment on loopback: PostgreSQL instance, run queue, "
                          "daemon, webserver and Celery workers (docs/scale-out.md).")
app.add_typer(cluster_app, name="cluster")
ClusterRoot = typer.Option(Path(".lazyhippo-cluster"), "--root", help="Folder of the cluster's processes.")


@cluster_app.command("up")
def cluster_up(root: Path = ClusterRoot, workers: int = typer.Option(2, min=1, help="Celery workers (worker 1 also "
                                                                     "serves the warehouse queue)."),
               port: Optional[int] = typer.Option(None, help="Webserver port [a free one]."),
               snapshots: Optional[str] = typer.Option(None, help="s3://bucket/prefix published snapshots go to.")) -> None:
    """Start the daemon, the webserver and N Celery workers, each in its own folder (needs `services.sh start
    postgres redis minio`)."""
    from lazyhippo_dagster import cluster

    try:
        c = cluster.up(root, workers, port, snapshots)
    except (RuntimeError, TimeoutError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1)
    console.print_json(json.dumps(cluster.status(c.root)))


@cluster_app.command("down")
def cluster_down(root: Path = ClusterRoot) -> None:
    """Stop every process of the cluster."""
    from lazyhippo_dagster import cluster

    console.print(f"stopped: {', '.join(cluster.down(root)) or 'nothing was running'}")


@cluster_app.command("status")
def cluster_status(root: Path = ClusterRoot) -> None:
    """Which processes run, the webserver's address, the workers that answer, where the warehouse lives."""
    from lazyhippo_dagster import cluster

    console.print_json(json.dumps(cluster.status(root)))


@cluster_app.command("index")
def cluster_index(source: Path = typer.Argument(..., help="Folder or file readable by the warehouse worker."),
                  namespace: str = typer.Option("default", "--namespace", "-n"), root: Path = ClusterRoot) -> None:
    """Index through the cluster's run queue: one `index` run of the namespace."""
    from lazyhippo_dagster import cluster

    with _unreadable_source(root, namespace, {}):
        runs = cluster.index(cluster.Cluster(root.resolve()), namespace, str(source.resolve()))
    for run in runs:
        console.print(f"{run.job_name} {run.run_id}: {run.status.value}")
    if not all(r.is_success for r in runs):
        raise typer.Exit(1)


def _wiki(name: str) -> Path:
    """A file of the 2WikiMultihopQA set under $LAZYHIPPO_DATASETS (default ../shared/datasets)."""
    return environment().datasets / "2wikimultihopqa" / name


def _progress_bar():
    bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console)
    tasks: dict[str, int] = {}

    def update(stage: str, done: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = bar.add_task(stage, total=total)
        bar.update(tasks[stage], completed=done, total=total)

    return bar, update


def _print_frame(frame, title: str) -> None:
    """A benchmark's result table (a polars frame) on the terminal: text left, figures right."""
    table = Table(title=title)
    for name, dtype in frame.schema.items():
        table.add_column(name, justify="right" if dtype.is_numeric() else "left")
    for row in frame.iter_rows():
        table.add_row(*("" if v is None else str(v) for v in row))
    Console().print(table)


def _dataset_run(name: str, embedder: Optional[str], workdir: Path) -> tuple[Path, Path, Path]:
    """(corpus, questions, workspace) of a shared set by name; one workspace per set and embedder profile."""
    from lazyhippo.evaluate.bench import dataset_files

    embedder = embedder or Settings.from_env().embedder
    if embedder not in PROFILES:
        raise typer.BadParameter(f"unknown embedder {embedder!r} (expected one of {', '.join(PROFILES)})", param_hint="--embedder")
    try:
        corpus, questions = dataset_files(name, environment().datasets)
    except (ValueError, FileNotFoundError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--dataset") from exc
    return corpus, questions, workdir / (name if embedder == Settings().embedder else f"{name}-{embedder}")


def _retrieval_assist(settings: Settings, timeout: float, rounds: int):
    """The LLM steps of the local route on the configured endpoint, one try per step (the timeout and the
    breaker fall back to the offline ranking); a clear error when no endpoint is configured."""
    from lazyhippo.models.llm import LLMConfig, LLMError, OpenAIChat
    from lazyhippo.query.assist import RetrievalAssist

    if settings.llm != "openai":
        raise typer.BadParameter("no LLM endpoint is configured: set OPENAI_BASE_URL (and OPENAI_API_KEY, "
                                 "LAZYHIPPO_LLM_MODEL)", param_hint="--llm")
    client = OpenAIChat(LLMConfig.from_env(settings.llm_model, timeout=timeout, max_retries=0))
    try:
        client.check()
    except LLMError as exc:
        raise typer.BadParameter(str(exc), param_hint="--llm") from exc
    return RetrievalAssist(client, timeout=timeout, rounds=rounds)


@bench.command("retrieval")
def bench_retrieval(dataset: Optional[str] = typer.Option(None, help="2wiki | hotpotqa | musique | gitdocs | all: a shared "
                                                                  "set by name (overrides --corpus/--questions)."),
                    corpus: Optional[Path] = typer.Option(None, help="JSONL corpus {id,title,text}, or a folder of documents."),
                    questions: Optional[Path] = typer.Option(None,
                                                   help='[{"question","supporting_titles"[,"supporting_ids"]}] or '
                                                        '[{"question","gold_files"}] (paths inside the corpus folder)'),
                    route: str = typer.Option("local", help="The route under test; several, comma-separated, are "
                                                            "measured side by side (the first is the one `bench keep` reads)."),
                    k: int = typer.Option(8, help="Chunks retrieved per question, by every route and baseline."),
                    embedder: str = typer.Option(None, help=" | ".join(PROFILES)),
                    workdir: Path = typer.Option(Path(".lazyhippo-bench"), help="Index workspace (reused when it holds the same corpus)."),
                    json_out: Optional[Path] = typer.Option(None, "--json", help="Write metrics and per-question rankings here."),
                    graph_store: str = typer.Option("embedded", help="embedded | neo4j (the index is pushed to it, PPR runs over the graph it serves)"),
                    split: str = typer.Option("all", help="tune | confirm | all: the half of each set's questions chosen by a "
                                                          "hash of the question text (decide on tune, report confirm)."),
                    llm: bool = typer.Option(False, "--llm", help="LLM-assisted local route (recognition memory, iterative "
                                                                  "multi-hop) through the configured endpoint (OPENAI_BASE_URL)."),
                    llm_timeout: float = typer.Option(10.0, help="Seconds per LLM step before it falls back to the offline ranking."),
                    llm_rounds: int = typer.Option(3, min=1, max=3, help="Retrievals per question with --llm."),
                    set_: list[str] = typer.Option([], "--set", help="A query setting of the route under test, "
                                                   "section.field=value, repeatable (e.g. graph.synonym_min_score=0.6).")) -> None:
    """Recall@2/@5 and all_supporting@8 of a route against BM25 and dense-only baselines, in one run; scored by
    source file when the questions carry `gold_files`, by passage id when they carry `supporting_ids`. The
    summary shows the tune and confirm halves side by side."""
    import polars as pl

    from lazyhippo.evaluate.bench import DATASETS, SPLITS, headline, part_rows, query_config, run_retrieval_bench, summary_row
    from lazyhippo.query.routes import check_route

    if split not in SPLITS:
        raise typer.BadParameter(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})", param_hint="--split")
    try:
        config = query_config(set_)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--set") from None

    corpus, questions = corpus or _wiki("corpus.jsonl"), questions or _wiki("questions_dev.json")
    names = list(DATASETS) if dataset == "all" else [dataset] if dataset else []
    runs = [(n, *_dataset_run(n, embedder, workdir)) for n in names] or [(corpus.stem, corpus, questions, workdir)]
    settings = Settings.from_env(embedder=embedder)
    routes = [r.strip() for r in route.split(",") if r.strip()]
    try:
        for r in routes:
            check_route(r)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--route") from None
    if not routes:
        raise typer.BadParameter("no route given", param_hint="--route")
    if llm and routes != ["local"]:
        raise typer.BadParameter("--llm assists the local route only", param_hint="--route")
    assist = _retrieval_assist(settings, llm_timeout, llm_rounds) if llm else None
    results = {}
    for name, corpus_file, questions_file, wd in runs:
        bar, update = _progress_bar()
        with bar:
            result = run_retrieval_bench(corpus_file, questions_file, wd, route=routes, k=k, progress=update,
                                         graph_store=graph_store, settings=settings, split=split, assist=assist,
                                         config=config)
        results[name] = result
        _print_frame(pl.DataFrame(list(result["methods"].values())),
                     f"retrieval on {name} ({graph_store} store): {result['questions']} questions ({split}), "
                     f"scored by {result['scored_by']}, "
                     f"index {result['index_seconds']:.1f}s" + (" (reused)" if result["reused"] else ""))
        _print_frame(pl.DataFrame(part_rows(result)), f"{name} by half" + (" and gold documents per question (hops)"
                                                                           if any(result["by_hops"].values()) else ""))
        for r, used in result["routes_used"].items():
            if used != {r: result["questions"]}:
                print(f"{name}: route {r} ran " + ", ".join(f"{n} {u}" for u, n in used.items()))
    _print_frame(pl.DataFrame([summary_row(n, r) for n, r in results.items()]),
                 f"summary: route {routes[0]}, top {k}, embedder {settings.embedder}, t = tune half, c = confirm half")
    if json_out:
        json_out.write_text(json.dumps(results if len(results) > 1 else next(iter(results.values())), indent=1))
    for name, result in results.items():
        print(json.dumps({"dataset": name, **headline(result)}))


@bench.command("answerable")
def bench_answerable(dataset: str = typer.Option("all", help="2wiki | hotpotqa | musique | gitdocs | all (comma-separated: "
                                                             "at least two, each asked of the others' indexes)."),
                     split: str = typer.Option("all", help="tune | confirm | all (the halves of `bench retrieval`)."),
                     workdir: Path = typer.Option(Path(".lazyhippo-bench"), help="Index workspaces (those of `bench "
                                                  "retrieval`, reused when they hold the same corpus)."),
                     json_out: Optional[Path] = typer.Option(None, "--json", help="Write the per-question rows here.")) -> None:
    """How often offline answers say "not answerable" rightly: each set's questions asked of its own index
    (missed: answerable ones marked not answerable) and of every other set's index (caught: marked not
    answerable), at the current threshold, and the range of thresholds at which the tune halves meet every target
    (missed at most 5% on the sets' mean and 10% on any set, caught at least 90%); of each set's own questions with a
    short gold answer, the share of answers that hold it, and the answers' mean length."""
    import polars as pl

    from lazyhippo.evaluate.answerable import ANSWER_SETS, answer_set_files, calibrate, mean_rates, rates, run_answerable_bench
    from lazyhippo.evaluate.bench import SPLITS
    from lazyhippo.query.answer import SUPPORT_THRESHOLD

    if split not in SPLITS:
        raise typer.BadParameter(f"unknown split {split!r} (expected one of {', '.join(SPLITS)})", param_hint="--split")
    names = list(ANSWER_SETS) if dataset == "all" else [n.strip() for n in dataset.split(",") if n.strip()]
    if len(names) < 2:
        raise typer.BadParameter("name at least two sets: out-of-corpus questions come from the others", param_hint="--dataset")
    sets = {}
    for name in names:
        try:
            corpus, questions = answer_set_files(name, environment().datasets)
        except (ValueError, FileNotFoundError) as exc:
            raise typer.BadParameter(str(exc), param_hint="--dataset") from exc
        sets[name] = (corpus, questions, workdir / name)
    bar, update = _progress_bar()
    with bar:
        rows = run_answerable_bench(sets, split, Settings.from_env(), update)
    table = rates(rows, SUPPORT_THRESHOLD)
    _print_frame(pl.DataFrame(table), f"answerable or not at support >= {SUPPORT_THRESHOLD} ({split}): missed = answerable "
                                      "questions marked not answerable, caught = out-of-corpus questions marked so")
    if json_out:
        json_out.write_text(json.dumps(rows, indent=1))
    halves = {h: mean_rates(table, h) for h in ("tune", "confirm") if any(r["half"] == h for r in table)}
    print(json.dumps({"threshold": SUPPORT_THRESHOLD, **{f"{h}_{k}": v for h, m in halves.items() for k, v in m.items()},
                      **({"tune_range": calibrate(rows)} if "tune" in halves else {})}))


@bench.command("keep")
def bench_keep(base: Path = typer.Argument(..., help="`bench retrieval --json` output of the current defaults."),
               candidate: Path = typer.Argument(..., help="The same with the change."),
               removal: bool = typer.Option(False, "--removal", help="The change removes something: no gain needed, only no loss.")) -> None:
    """The keep rule on the confirm halves: no set loses more than one question's worth on recall@2, recall@5
    or all_supporting@8, and (unless --removal) one gains. Exits 1 when the change is not kept."""
    from lazyhippo.evaluate.bench import keep_change

    try:
        verdict = keep_change(_route_rows(base), _route_rows(candidate), require_gain=not removal)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    print(json.dumps(verdict, indent=1))
    raise typer.Exit(0 if verdict["keep"] else 1)


@bench.command("same")
def bench_same(base: Path = typer.Argument(..., help="`bench retrieval --json` output before the change."),
               candidate: Path = typer.Argument(..., help="The same after it."),
               k: int = typer.Option(8, min=1, help="Passages compared per question, in order.")) -> None:
    """Whether a change leaves the answers alone: per set, the questions whose top k passages (in order) moved.
    Exits 1 when any did."""
    from lazyhippo.evaluate.bench import ranking_changes

    try:
        verdict = ranking_changes(_route_rows(base), _route_rows(candidate), k)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    print(json.dumps(verdict, indent=1))
    raise typer.Exit(0 if verdict["same"] else 1)


def _route_rows(path: Path) -> dict[str, list[dict]]:
    """The route's per-question rows of a `bench retrieval --json` output, by set (one set: by its corpus)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(f"{path}: {exc}") from exc
    results = {data["corpus"]: data} if "methods" in data else data
    return {name: r["per_question"][r["route"]] for name, r in results.items()}


@bench.command("query")
def bench_query(dataset: Optional[str] = typer.Option(None, help="2wiki | hotpotqa | musique | gitdocs (overrides --corpus/--questions)."),
                corpus: Optional[Path] = typer.Option(None),
                questions: Optional[Path] = typer.Option(None),
                embedder: str = typer.Option(None, help=" | ".join(PROFILES)),
                routes: str = typer.Option("local,global"),
                workdir: Path = typer.Option(Path(".lazyhippo-bench")),
                graph_store: str = typer.Option("embedded", help="embedded | neo4j (the index is loaded into it first)"),
                repeat: int = typer.Option(3, help="Passes over the questions per route."),
                cli: int = typer.Option(0, min=0, help="Instead: time this many `lazyhippo query` processes (route "
                                                       "auto), one question each, as a user runs them."),
                baseline: Optional[Path] = typer.Option(None, help="With --cli: another build's `lazyhippo` "
                                                        "executable, run alternately with this one (same load)."),
                warm: bool = typer.Option(False, "--warm", help="With --cli: also through the home's query daemon "
                                          "(`lazyhippo daemon`), alternately with the cold commands.")) -> None:
    """p50/p95 latency per route: retrieval + context assembly (query embedding included, no LLM), and with the
    extractive answer (answer_*); with --cli, the wall time of whole `lazyhippo query` commands."""
    import polars as pl

    from lazyhippo.evaluate.bench import ensure_index, run_cli_latency, run_latency_bench

    corpus, questions = corpus or _wiki("corpus.jsonl"), questions or _wiki("questions_dev.json")
    if dataset:
        corpus, questions, workdir = _dataset_run(dataset, embedder, workdir)
    bar, update = _progress_bar()
    with bar:
        settings, info = ensure_index(corpus, workdir, update, Settings.from_env(embedder=embedder))
        if warm and not cli:
            raise typer.BadParameter("needs --cli N", param_hint="--warm")
        if cli:
            if baseline is not None and not baseline.is_file():
                raise typer.BadParameter(f"{baseline} is not a file", param_hint="--baseline")
            result = run_cli_latency(settings, json.loads(questions.read_text()), cli, baseline, warm)
        else:
            result = run_latency_bench(settings, json.loads(questions.read_text()), routes.split(","), repeat, graph_store)
    if cli:
        figures = {k: round(v, 2 if k.startswith("load") or k.endswith("ratio") else 1) for k, v in result.items()}
        _print_frame(pl.DataFrame([figures]), f"`lazyhippo query` wall time on {corpus.name}")
        print(json.dumps({"cli_" + k: v for k, v in figures.items()}))
        return
    cols = ("p50_ms", "p95_ms", "answer_p50_ms", "answer_p95_ms")
    _print_frame(pl.DataFrame([{"route": route, **r} for route, r in result.items()]).with_columns(pl.col(cols).round(2)),
                 f"query latency on {corpus.name} ({graph_store} store)")
    print(json.dumps({"graph_store": graph_store, **{f"{route}_{c}": round(r[c], 2) for route, r in result.items() for c in cols}}))


@bench.command("index")
def bench_index(corpus: Optional[Path] = typer.Option(None, help="JSONL corpus {id,title,text}; with --growth also a "
                                                            "folder of documents, of which the first N are indexed."),
                workers: int = typer.Option(2, min=1, help="Worker processes of the parallel run (against 1); 1 skips "
                                                           "that comparison."),
                limit: Optional[int] = typer.Option(None, min=1, help="Index only the first N documents."),
                workdir: Path = typer.Option(Path(".lazyhippo-bench-index"), help="Scratch folder (emptied first)."),
                executor: str = typer.Option("multiprocess", help="multiprocess | celery (a loopback cluster: needs "
                                             "PostgreSQL, Redis and MinIO)"),
                storage: str = typer.Option("sqlite", help="Dagster storage the in-process runs are recorded in: "
                                            "sqlite (the home's instance) | postgres (the cluster's instance on "
                                            "PostgreSQL: needs it running)."),
                growth: Optional[str] = typer.Option(None, help="Corpus sizes in documents, e.g. 1000,10000: per size a "
                                                     "full in-process index of real text (the shared sets, gitdocs, "
                                                     "Debian's /usr/share/doc): time, memory, disk, rows, query latency."),
                as_json: Optional[Path] = typer.Option(None, "--json", help="With --growth or --stages: also write the results here "
                                                       "(with --growth, after each size)."),
                stages: bool = typer.Option(False, "--stages", help="One full index of --corpus (a JSONL file or a folder) "
                                            "through the library entry point: wall and CPU seconds per stage, MB a minute.")) -> None:
    """Full index with 1 and with N worker processes (multiprocess executor) and in-process, then the time to bring
    the index up to date after one changed and after one deleted document; each run's event-log rows and the share
    of its time outside every step (Dagster's own). With --executor celery: 1 and N Celery workers of a loopback
    cluster. With --growth: the cost of a full index at each corpus size. With --stages: where one index's time goes."""
    from lazyhippo_dagster.bench_index import index_table, run_cluster_index_bench, run_index_bench, run_stage_bench, stage_table

    if stages:
        corpus = corpus or _wiki("corpus.jsonl")
        if not corpus.exists():
            console.print(f"[red]error:[/red] --corpus {corpus} does not exist")
            raise typer.Exit(2)
        result = run_stage_bench(corpus.resolve(), workdir.resolve(), progress=lambda m: console.print(f"[bold]{m}[/bold]"))
        _print_frame(stage_table(result), f"index of {corpus.name}: {result['mb']} MB, load average {result['load_start']}")
        print(json.dumps({k: v for k, v in result.items() if k != "stages"}))
        if as_json:
            as_json.write_text(json.dumps(result, indent=1))
        return

    if growth is not None:
        from lazyhippo_dagster.bench_growth import growth_memory_table, growth_rows_table, growth_table, run_growth_bench

        try:
            sizes = [int(s) for s in growth.split(",") if s.strip()]
        except ValueError:
            sizes = []
        if not sizes or min(sizes) < 1:
            console.print(f"[red]error:[/red] --growth {growth!r}: expected document counts like 1000,10000")
            raise typer.Exit(2)
        datasets = environment().datasets
        if corpus is not None and not corpus.exists():
            console.print(f"[red]error:[/red] --corpus {corpus} does not exist")
            raise typer.Exit(2)
        try:
            results = run_growth_bench(datasets, sizes, workdir.resolve(), progress=lambda m: console.print(f"[bold]{m}[/bold]"),
                                       corpus=corpus.resolve() if corpus else None,
                                       on_size=(lambda r: as_json.write_text(json.dumps(r, indent=1))) if as_json else None)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
        _print_frame(growth_table(results), "index cost by corpus size")
        _print_frame(growth_rows_table(results), "rows per table")
        _print_frame(growth_memory_table(results), "peak RSS MB per step (process tree / run process) and per process")
        if as_json:
            as_json.write_text(json.dumps(results, indent=1))
        return

    corpus = corpus or _wiki("corpus.jsonl")
    if not corpus.is_file():
        console.print(f"[red]error:[/red] corpus {corpus} does not exist")
        raise typer.Exit(2)
    if executor not in ("multiprocess", "celery"):
        console.print(f"[red]error:[/red] --executor {executor!r}: expected multiprocess or celery")
        raise typer.Exit(2)
    if storage not in ("sqlite", "postgres"):
        console.print(f"[red]error:[/red] --storage {storage!r}: expected sqlite or postgres")
        raise typer.Exit(2)
    if executor == "celery":
        result = run_cluster_index_bench(corpus, workdir.resolve(), workers, limit,
                                         progress=lambda m: console.print(f"[bold]{m}[/bold]"))
        print(json.dumps(_rounded(result)))
        return
    try:
        result = run_index_bench(corpus, workdir.resolve(), workers, limit,
                                 progress=lambda m: console.print(f"[bold]{m}[/bold]"), storage=storage)
    except MissingCredentials as exc:
        console.print(f"[red]error:[/red] --storage postgres: {exc}")
        raise typer.Exit(2)
    _print_frame(index_table(result), f"index on {corpus.name}: {result['documents']} documents ({storage} storage)")
    print(json.dumps(_rounded({k: v for k, v in result.items() if not isinstance(v, dict)})))


@bench.command("ui")
def bench_ui(home: Path = typer.Option(Path(".lazyhippo"), help="Index home whose Dagster instance is loaded (its "
                                       "`dagster/` folder, or DAGSTER_HOME when set)."),
             run_id: Optional[str] = typer.Option(None, help="The run whose page is loaded (default: the longest "
                                                  "successful `index` run: the full index)."),
             asset: str = typer.Option("documents", help="The asset whose page is loaded."),
             repeat: int = typer.Option(3, min=1, help="Loads of each page after the first (their median is shown)."),
             as_json: Optional[Path] = typer.Option(None, "--json", help="Also write the results here.")) -> None:
    """Start `dagster-webserver` on the home's instance and time the GraphQL operations the Dagster UI sends to
    load the asset catalog, an asset's page and a run's page (target: each page within 2 s)."""
    import polars as pl

    from lazyhippo_dagster.bench_ui import PAGE_TARGET_S, run_ui_bench

    dagster_home = Path(os.environ.get("DAGSTER_HOME") or home / "dagster").resolve()
    if not (dagster_home / "dagster.yaml").is_file():
        console.print(f"[red]error:[/red] --home {home}: no Dagster instance at {dagster_home} (index it first)")
        raise typer.Exit(2)
    try:
        result = run_ui_bench(dagster_home, run_id, asset, repeat, progress=lambda m: console.print(f"[bold]{m}[/bold]"))
    except (ValueError, RuntimeError) as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1)
    rows = [{"page": page, "operation": op, "first s": o["first_s"], "median s": o["median_s"],
             "first CPU s": o["first_cpu_s"], "median CPU s": o["median_cpu_s"], "KB": o["kb"]}
            for page, p in result["pages"].items()
            for op, o in [*p["operations"].items(), ("whole page", {**p, "kb": sum(x["kb"] for x in p["operations"].values())})]]
    _print_frame(pl.DataFrame(rows).with_columns(pl.exclude("page", "operation", "KB").round(3), pl.col("KB").round(1)),
                 f"Dagster UI pages of run {result['run_id']} ({result['run_event_rows']} event rows); "
                 f"target {PAGE_TARGET_S:g} s each; load average {result['load_average'][0]:.1f}")
    if as_json:
        as_json.write_text(json.dumps(result, indent=1))
    print(json.dumps(_rounded({"run_id": result["run_id"], "slowest_page_s": result["slowest_page_s"],
                               "slowest_page_cpu_s": result["slowest_page_cpu_s"], "meets_target": result["meets_target"],
                               **{f"{page} first_s": p["first_s"] for page, p in result["pages"].items()},
                               **{f"{page} median_s": p["median_s"] for page, p in result["pages"].items()}}, 3)))


knn_bench = typer.Typer(no_args_is_help=True, help="The `knn_edges` stage alone on an indexed home's entity vectors: "
                        "time, CPU and peak memory of a search, an update's search, and the recall of one search "
                        "against another. `run` and `update` change the home: use a copy.")
bench.add_typer(knn_bench, name="knn")
KnnHome = typer.Argument(..., help="An indexed home (a copy: its knn_edges rows are replaced).")
KnnNamespace = typer.Argument(..., help="The namespace whose entity vectors are searched.")


@knn_bench.command("run")
def bench_knn_run(home: Path = KnnHome, namespace: str = KnnNamespace,
                  exact_max: Optional[int] = typer.Option(None, min=0, help="Entities up to which the search is exact "
                                                          "for this run (0: always the approximate index)."),
                  edges: Optional[Path] = typer.Option(None, help="Also write the edges to this Parquet file."),
                  update: bool = typer.Option(False, help="Keep the recorded search: time an update's search.")) -> None:
    """One search of the stage: wall and CPU seconds, the process's peak RSS, entities, edges, lists searched."""
    from lazyhippo_dagster.bench_knn import run

    print(json.dumps(run(home, namespace, exact_max, edges, update)))


@knn_bench.command("update")
def bench_knn_update(home: Path = KnnHome, namespace: str = KnnNamespace,
                     change: int = typer.Option(30, min=0, help="Entities given another entity's vector."),
                     add: int = typer.Option(20, min=0, help="Entities added as copies of others."),
                     round_: int = typer.Option(1, "--round", help="Another round picks other entities.")) -> None:
    """Move and add entity vectors, for `run --update` next."""
    from lazyhippo_dagster.bench_knn import move_vectors

    move_vectors(home, namespace, change, add, round_)


@knn_bench.command("recall")
def bench_knn_recall(exact: Path = typer.Argument(..., help="Edges of the exact search (`run --edges`)."),
                     other: Path = typer.Argument(..., help="Edges of the search compared.")) -> None:
    """The share of the exact search's edges another search found, all and from cosine 0.90 (those PPR walks)."""
    from lazyhippo_dagster.bench_knn import recall

    print(json.dumps(recall(exact, other)))


@knn_bench.command("synth")
def bench_knn_synth(home: Path = KnnHome, namespace: str = KnnNamespace,
                    out: Path = typer.Argument(..., help="The synthetic home written (its embeddings only)."),
                    copies: int = typer.Option(10, min=1), noise: float = typer.Option(0.03, min=0.0)) -> None:
    """A synthetic home of `copies` noisy copies of every entity vector (labelled synthetic in its model column)."""
    from lazyhippo_dagster.bench_knn import synth

    console.print(f"{synth(home, namespace, out, copies, noise):,} vectors in {out}")


@bench.command("memory")
def bench_memory(home: Path = typer.Argument(..., help="An indexed home (a copy: the stages rewrite its tables)."),
                 namespace: str = typer.Option("default", help="The namespace whose stages run.")) -> None:
    """Peak resident memory of each index stage, run one after another in this process on an indexed home as an
    index run runs them: resident MB before, peak (with the extraction workers), after, and seconds."""
    import polars as pl

    from lazyhippo_dagster.bench_memory import stage_memory

    if not (home / "warehouse.duckdb").is_file():
        console.print(f"[red]error:[/red] HOME {home}: no index here (warehouse.duckdb missing)")
        raise typer.Exit(2)
    rows = stage_memory(home, namespace, progress=lambda r: console.print(
        f"[bold]{r['step']}[/bold]: peak {r['peak MB']:,} MB, {r['seconds']} s"))
    _print_frame(pl.DataFrame(rows), f"index stages on {home} ({namespace}); load average {os.getloadavg()[0]:.1f}")


def _rounded(result, digits: int = 2):
    """A bench result's floats rounded for display (the bench functions keep them exact for their ratios)."""
    if isinstance(result, dict):
        return {k: _rounded(v, digits) for k, v in result.items()}
    return round(result, digits) if isinstance(result, float) else result


@bench.command("serve")
def bench_serve(clients: int = typer.Option(8, help="Concurrent clients."), seconds: float = typer.Option(30.0, help="Load time per route."),
                routes: str = typer.Option("local", help="Comma-separated routes to load, one after the other."),
                corpus: Optional[Path] = typer.Option(None),
                questions: Optional[Path] = typer.Option(None),
                max_questions: int = typer.Option(200, help="Distinct questions sent (cycled)."),
                workdir: Path = typer.Option(Path(".lazyhippo-bench")), port: int = typer.Option(8799),
                workers: int = typer.Option(2, min=1, help="Query engines of the server (`serve --workers`; one per core "
                                            "of the 2-core target machine)."),
                rate: float = typer.Option(0.0, help="Offered queries/s for all clients together (0: as fast as answers come).")) -> None:
    """Start `lazyhippo serve` on loopback over the bench index and load it: QPS, p50/p95/p99 and errors per route."""
    import signal
    import sys
    import tempfile

    corpus, questions = corpus or _wiki("corpus.jsonl"), questions or _wiki("questions_dev.json")

    import httpx

    from lazyhippo.evaluate.bench import ensure_index
    from lazyhippo.evaluate.bench_serve import LOAD_COLUMNS, load_table, run_load

    bar, update = _progress_bar()
    with bar:
        settings, _ = ensure_index(corpus, workdir, update)
    asked = [q["question"] for q in json.loads(questions.read_text())][:max_questions]
    key = environment().api_key
    headers = {"X-API-Key": key} if key else None
    log = tempfile.NamedTemporaryFile(prefix="lazyhippo-serve-", suffix=".log", delete=False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated bench still stops its server (finally)
    server = subprocess.Popen([sys.executable, "-m", "lazyhippo_dagster.cli", "serve", "--home", str(settings.home),
                               "--port", str(port), "--workers", str(workers)], stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 300
        while True:  # the server listens once every engine has loaded its indexes
            if server.poll() is not None or time.time() > deadline:
                console.print(f"[red]error:[/red] the server did not come up; its log: {log.name}")
                raise typer.Exit(1)
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        reports = [run_load(url, asked, r, clients, seconds, headers, rate=rate, server_pid=server.pid)
                   for r in routes.split(",")]
    finally:
        server.terminate()
        server.wait(30)
        log.close()
    _print_frame(load_table(reports), f"lazyhippo serve under load: {clients} clients, {len(asked)} questions from "
                                      f"{questions.name}, {workers} worker(s), "
                                      + (f"{rate:g} queries/s offered" if rate else "closed loop"))
    for r in reports:
        for sample in r.error_samples:
            console.print(f"[yellow]{r.route} error:[/yellow] {sample}")
    print(json.dumps({"clients": clients, "seconds": seconds, "workers": workers, "rate": rate, "cpus": os.cpu_count(),
                      **{f"{r.route}_{c}": getattr(r, c) for r in reports for c in LOAD_COLUMNS[1:]}}))


if __name__ == "__main__":
    app()
