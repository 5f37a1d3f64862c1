"""`lazyhippo chat`: a conversation over one index, history carried between turns under a token budget,
and the token usage the LLM reports printed per turn and per operation (also for `index` and `query`)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from lazyhippo.query.config import QueryOptions, option_fields
from lazyhippo.settings import CHUNK_SELECTIONS, RERANK_PROVIDERS, Settings


def _one_of(choices: tuple[str, ...]):
    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of: {', '.join(choices)}")
        return value
    return check


# the query-time options of every command that answers (query, chat, serve, mcp); unset, LAZYHIPPO_* decide
RerankOpt = typer.Option(None, "--rerank", callback=_one_of(RERANK_PROVIDERS),
                         help="Reranker: none | http | cross-encoder [$LAZYHIPPO_RERANK or none]; endpoint, model and "
                              "key from $LAZYHIPPO_RERANK_URL, $LAZYHIPPO_RERANK_MODEL, $LAZYHIPPO_RERANK_API_KEY.")
RerankTopNOpt = typer.Option(None, "--rerank-top-n", min=1, help="Best chunks the reranker reorders "
                             "[$LAZYHIPPO_RERANK_TOP_N or 20].")
SelectionOpt = typer.Option(None, "--chunk-selection", callback=_one_of(CHUNK_SELECTIONS),
                            help="How local routes pick chunks: graph (PPR), vector or weight (LightRAG) "
                                 "[$LAZYHIPPO_CHUNK_SELECTION or graph].")
MaxRelatedOpt = typer.Option(None, "--max-related-chunks", min=1, help="Chunks the vector/weight selections keep "
                             "[$LAZYHIPPO_MAX_RELATED_CHUNKS or 20].")
# the query options that are QueryConfig fields (query and chat; a server takes them per request)
_HELP = {name: text for name, _, text in option_fields()}
GroupOpt = typer.Option(None, "--group-neighbours/--no-group-neighbours", help=_HELP["group_neighbours"])
DampingOpt = typer.Option(None, "--damping", help=_HELP["damping"])
CommunitiesOpt = typer.Option(None, "--communities", help=_HELP["communities"])
KnnThresholdOpt = typer.Option(None, "--knn-threshold", help=_HELP["knn_threshold"])
HubWeightOpt = typer.Option(None, "--hub-weight", help=_HELP["hub_weight"])
LexicalWeightOpt = typer.Option(None, "--lexical-weight", help=_HELP["lexical_weight"])
MultiHopOpt = typer.Option(None, "--multi-hop", help=_HELP["multi_hop"])
SubquestionsOpt = typer.Option(None, "--subquestions/--no-subquestions", help=_HELP["subquestions"])


def query_options(**values) -> QueryOptions:
    """The options given on the command line; a bad one is a one-line error and exit code 2."""
    try:
        return QueryOptions.from_mapping(values)
    except ValueError as exc:
        Console(stderr=True).print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def print_usage(rows: list[dict], out: Console, title: str = "LLM tokens") -> None:
    """One line per operation and model: calls, input and output tokens (nothing when no LLM was called)."""
    if not rows:
        return
    table = Table(title=title)
    for col in ("operation", "model", "calls", "prompt_tokens", "completion_tokens"):
        table.add_column(col, justify="left" if col in ("operation", "model") else "right")
    for r in rows:
        table.add_row(r["operation"], r["model"], str(r.get("calls", "")), str(r["prompt_tokens"]), str(r["completion_tokens"]))
    out.print(table)


def run_usage(settings: Settings, run_id: str) -> list[dict]:
    """What one indexing run recorded in token_usage, per operation and model."""
    from lazyhippo.stores.warehouse import connect

    with connect(settings, read_only=True) as con:
        rows = con.execute("SELECT stage, model, sum(prompt_tokens), sum(completion_tokens) FROM token_usage "
                           "WHERE namespace = ? AND run_id = ? GROUP BY 1, 2 ORDER BY 1, 2",
                           [settings.namespace, run_id]).fetchall()
    return [{"operation": s, "model": m, "prompt_tokens": p, "completion_tokens": c} for s, m, p, c in rows]


def chat(home: Optional[Path] = typer.Option(None, "--home", help="Index folder [$LAZYHIPPO_HOME or ./.lazyhippo]."),
         namespace: Optional[str] = typer.Option(None, "--namespace", "-n", help="[$LAZYHIPPO_NAMESPACE or default]"),
         route: str = typer.Option("auto", help="auto | local | global"),
         top_k: int = typer.Option(8, "--top-k"), budget: int = typer.Option(32000, help="Context token budget."),
         history_budget: int = typer.Option(2000, help="Tokens of earlier turns sent along with each question."),
         rerank: Optional[str] = RerankOpt, rerank_top_n: Optional[int] = RerankTopNOpt,
         chunk_selection: Optional[str] = SelectionOpt, max_related_chunks: Optional[int] = MaxRelatedOpt,
         group_neighbours: Optional[bool] = GroupOpt, damping: Optional[float] = DampingOpt,
         communities: Optional[int] = CommunitiesOpt, knn_threshold: Optional[float] = KnnThresholdOpt,
         hub_weight: Optional[float] = HubWeightOpt, lexical_weight: Optional[float] = LexicalWeightOpt,
         multi_hop: Optional[int] = MultiHopOpt, subquestions: Optional[bool] = SubquestionsOpt) -> None:
    """Ask questions in turn (empty line or Ctrl-D ends); each answer sees the conversation so far."""
    from lazyhippo.query import answer_question
    from lazyhippo.stores.usage import record_answer_usage
    from lazyhippo.stores.warehouse import has_chunks

    options = query_options(rerank=rerank, rerank_top_n=rerank_top_n, chunk_selection=chunk_selection,
                            max_related_chunks=max_related_chunks, group_neighbours=group_neighbours, damping=damping,
                            communities=communities, knn_threshold=knn_threshold, hub_weight=hub_weight,
                            lexical_weight=lexical_weight, multi_hop=multi_hop, subquestions=subquestions)
    settings = options.settings(Settings.from_env(home=home, namespace=namespace))
    config = options.config()
    err = Console(stderr=True)
    if not has_chunks(settings):
        err.print(f"[red]error:[/red] namespace {namespace!r} in {settings.home} has no index yet: run `lazyhippo index` first")
        raise typer.Exit(2)
    out = Console()
    session = f"chat-{uuid.uuid4().hex[:12]}"  # the run id of this conversation's token_usage rows
    history: list[dict] = []
    while True:
        try:
            question = input("you> ").strip()
        except EOFError:
            break
        if not question:
            break
        res = answer_question(settings, question, route=route, top_k=top_k, budget=budget, history=history,
                              history_budget=history_budget, config=config)
        out.print(f"[bold]lazyhippo>[/bold] {res.answer}  [dim](route {res.route}, {len(res.history)} earlier turns sent, "
                  f"rerank {res.diagnostics['rerank']['status']})[/dim]")
        for cite in res.citations:
            out.print(f"  [{cite['n']}] {cite['title']} ({cite['chunk_id']})")
        print_usage(res.usage, out)
        record_answer_usage(settings.home, settings.namespace, session, res.usage)
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": res.answer}]
