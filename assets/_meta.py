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
