"""Metadata helpers: previews as typed tables (their columns show in the UI), figures as plain values
(Dagster plots numeric metadata across materializations)."""

from __future__ import annotations

from typing import Any, Sequence

import dagster as dg
import polars as pl

OWNERS = ["team:lazyhippo"]
TEXT_WIDTH = 200


def _kind(dtype: pl.DataType) -> str:
    if dtype == pl.Boolean:
        return "bool"
    return "int" if dtype.is_integer() else "float" if dtype.is_float() else "string"


def _text(name: str, dtype: pl.DataType) -> pl.Expr:
    """A text cell cut to TEXT_WIDTH characters (lists joined), so a preview stays small in the event log."""
    col = pl.col(name).list.eval(pl.element().cast(pl.String)).list.join(", ") if isinstance(dtype, pl.List) \
        else pl.col(name).cast(pl.String)
    return (pl.when(col.str.len_chars() > TEXT_WIDTH).then(col.str.slice(0, TEXT_WIDTH - 1) + "…")
            .otherwise(col).alias(name))


def frame_table(frame: pl.DataFrame) -> dg.TableMetadataValue:
    """A polars frame as `MetadataValue.table` with a `TableSchema` whose column types follow the frame's."""
    frame = frame.with_columns(pl.col(pl.Decimal).cast(pl.Float64))  # SQL's round() and numerics are decimals
    frame = frame.with_columns(_text(n, t) for n, t in frame.schema.items() if _kind(t) == "string")
    schema = dg.TableSchema(columns=[dg.TableColumn(n, _kind(t)) for n, t in frame.schema.items()])
    return dg.MetadataValue.table([dg.TableRecord(r) for r in frame.iter_rows(named=True)], schema)


def table(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> dg.TableMetadataValue:
    """Python rows as a typed table: a column of ints and floats is float, of mixed kinds text."""
    return frame_table(pl.DataFrame([tuple(r) for r in rows], schema=list(columns), orient="row", strict=False,
                                    infer_schema_length=None))


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
