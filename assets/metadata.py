"""Metadata helpers: previews as typed tables (their columns show in the UI), figures as plain values
(Dagster plots numeric metadata across materializations)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, Sequence

import dagster as dg

OWNERS = ["team:lazyhippo"]
TEXT_WIDTH = 200


def _kind(values: Sequence[Any]) -> str:
    """A column's type as a table schema names it: bool, int, float (ints and floats mixed), else string."""
    present = [v for v in values if v is not None]
    if not present:
        return "string"
    if all(isinstance(v, bool) for v in present):
        return "bool"
    if any(isinstance(v, bool) for v in present):
        return "string"
    if all(isinstance(v, int) for v in present):
        return "int"
    return "float" if all(isinstance(v, (int, float, Decimal)) for v in present) else "string"


def _cell(value: Any, kind: str) -> Any:
    """A value as its column's kind; text cut to TEXT_WIDTH characters (lists joined), so a preview stays small
    in the event log."""
    if value is None or kind in ("bool", "int"):
        return value
    if kind == "float":
        return float(value)
    text = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return text if len(text) <= TEXT_WIDTH else text[:TEXT_WIDTH - 1] + "…"


def table(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> dg.TableMetadataValue:
    """Python rows as a typed table: a column of ints and floats is float, of mixed kinds text. Plain Python, so
    the runs that write one (a CLI query's) need not import a dataframe library."""
    rows = [tuple(r) for r in rows]
    kinds = [_kind([r[i] for r in rows]) for i in range(len(columns))]
    schema = dg.TableSchema(columns=[dg.TableColumn(n, k) for n, k in zip(columns, kinds)])
    return dg.MetadataValue.table([dg.TableRecord({n: _cell(r[i], k) for i, (n, k) in enumerate(zip(columns, kinds))})
                                   for r in rows], schema)


def preview(con, sql: str, params: Sequence, columns: Sequence[str]) -> dg.TableMetadataValue:
    """A few rows of a query (a DB-API result: the stage may leave one open on the connection, which a relation
    would refuse), named `columns` (joins repeat names)."""
    return table(con.execute(sql, list(params)).fetchall(), columns)


def figures(values: dict) -> dict:
    """The plain numbers and strings of a check's figures, ready for metadata."""
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


PREVIEW_ROWS = 5  # rows of a chunk preview


def check_result(res, tables: dict | None = None,
                 severity: dg.AssetCheckSeverity = dg.AssetCheckSeverity.ERROR) -> dg.AssetCheckResult:
    """A lazyhippo CheckResult as an AssetCheckResult: figures as plain values, failing ids as a table."""
    metadata: dict = figures(res.figures)
    if res.examples:
        metadata["failing"] = table([(e,) for e in res.examples[:200]], ["failing"])
    return dg.AssetCheckResult(passed=res.passed, description=res.description, metadata={**metadata, **(tables or {})},
                               severity=severity)


def llm_usage(rows: list[dict]) -> dict:
    """Token usage of a stage or a question (one row per operation and model) as a table, plus totals."""
    if not rows:
        return {}
    cols = ["operation", "model", "calls", "prompt_tokens", "completion_tokens"]
    return {"llm_usage": table([[r.get(c) for c in cols] for r in rows], cols),
            "llm_prompt_tokens": sum(r["prompt_tokens"] for r in rows),
            "llm_completion_tokens": sum(r["completion_tokens"] for r in rows)}
