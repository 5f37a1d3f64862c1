"""`lazyhippo chat`: a conversation over one index, history carried between turns under a token budget,
and the token usage the LLM reports printed per turn and per operation (also for `index` and `query`)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from lazyhippo.settings import Settings


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
         route: str = typer.Option("auto", help="local | global | drift | hybrid | auto"),
         top_k: int = typer.Option(8, "--top-k"), budget: int = typer.Option(32000, help="Context token budget."),
         history_budget: int = typer.Option(2000, help="Tokens of earlier turns sent along with each question.")) -> None:
    """Ask questions in turn (empty line or Ctrl-D ends); each answer sees the conversation so far."""
    from lazyhippo.query import answer_question
    from lazyhippo.stores.warehouse import counts

    settings = Settings.from_env(home=home, namespace=namespace)
    err = Console(stderr=True)
    if not counts(settings)["chunks"]:
        err.print(f"[red]error:[/red] namespace {namespace!r} in {settings.home} has no index yet: run `lazyhippo index` first")
        raise typer.Exit(2)
    out = Console()
    history: list[dict] = []
    while True:
        try:
            question = input("you> ").strip()
        except EOFError:
            break
        if not question:
            break
        res = answer_question(settings, question, route=route, top_k=top_k, budget=budget, history=history,
                              history_budget=history_budget)
        out.print(f"[bold]lazyhippo>[/bold] {res.answer}  [dim](route {res.route}, {len(res.history)} earlier turns sent)[/dim]")
        for cite in res.citations:
            out.print(f"  [{cite['n']}] {cite['title']} ({cite['chunk_id']})")
        print_usage(res.usage, out)
        history += [{"role": "user", "content": question}, {"role": "assistant", "content": res.answer}]
