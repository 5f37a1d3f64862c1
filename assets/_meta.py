"""Metadata helpers so every materialization shows counts and a preview in the UI."""

from __future__ import annotations

from typing import Any, Sequence

import dagster as dg


def md_table(rows: Sequence[Sequence[Any]], header: Sequence[str], width: int = 80) -> dg.MetadataValue:
    def cell(v: Any) -> str:
        s = str(v).replace("|", "\\|").replace("\n", " ")
        return s if len(s) <= width else s[: width - 1] + "…"

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return dg.MetadataValue.md("\n".join(lines))


def preview(con, sql: str, params: Sequence, header: Sequence[str]) -> dg.MetadataValue:
    return md_table(con.execute(sql, list(params)).fetchall(), header)


def scalars(stats: dict) -> dict:
    """The plain numbers and strings of a stage's figures, ready for metadata."""
    return {k: v for k, v in stats.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


def llm_usage(rows: list[dict]) -> dict:
    """Token usage of a stage (one row per operation and model) as a table, plus the totals."""
    if not rows:
        return {}
    schema = dg.TableSchema(columns=[dg.TableColumn("operation", "string"), dg.TableColumn("model", "string"),
                                     dg.TableColumn("calls", "int"), dg.TableColumn("prompt_tokens", "int"),
                                     dg.TableColumn("completion_tokens", "int")])
    return {"llm_usage": dg.MetadataValue.table([dg.TableRecord(r) for r in rows], schema=schema),
            "llm_prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "llm_completion_tokens": sum(r["completion_tokens"] for r in rows)}
