"""Metadata helpers: previews as typed tables (their columns show in the UI), figures as plain values
(Dagster plots numeric metadata across materializations)."""

from __future__ import annotations

from typing import Any, Sequence

import dagster as dg

OWNERS = ["team:lazyhippo"]
TEXT_WIDTH = 200


def _cell(v: Any):
    if v is None or isinstance(v, (bool, int, float)):
        return v
    s = str(v)
    return s if len(s) <= TEXT_WIDTH else s[: TEXT_WIDTH - 1] + "…"


def _type(values: Sequence[Any]) -> str:
    kinds = {type(v) for v in values if v is not None}
    if kinds and kinds <= {bool}:
        return "bool"
    if kinds and kinds <= {int}:
        return "int"
    if kinds and kinds <= {int, float}:
        return "float"
    return "string"


def table(rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> dg.TableMetadataValue:
    """Rows as `MetadataValue.table` with a `TableSchema` whose column types follow the values."""
    cells = [[_cell(v) for v in row] for row in rows]
    schema = dg.TableSchema(columns=[dg.TableColumn(c, _type([r[i] for r in cells]))
                                     for i, c in enumerate(columns)])
    return dg.MetadataValue.table([dg.TableRecord(dict(zip(columns, r))) for r in cells], schema)


def preview(con, sql: str, params: Sequence, columns: Sequence[str]) -> dg.TableMetadataValue:
    return table(con.execute(sql, list(params)).fetchall(), columns)


def figures(values: dict) -> dict:
    """The plain numbers and strings of a check's figures, ready for metadata."""
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str)) and not isinstance(v, bool)}


PREVIEW_PARTITIONS = 20  # a run over more document partitions records its figures without the tables


def per_partition(partitions: int, values: dict) -> dict:
    """Metadata for a run over `partitions` document partitions: Dagster copies it into every partition's
    materialization, so a large run (a first index) keeps its row count and the other figures as one JSON
    entry, without the tables (previews): a few hundred bytes per partition instead of several kilobytes."""
    if partitions <= PREVIEW_PARTITIONS:
        return values
    rest = {k: v for k, v in values.items()
            if k not in ("dagster/row_count", "run_documents") and not isinstance(v, dg.TableMetadataValue)}
    return {**({"dagster/row_count": values["dagster/row_count"]} if "dagster/row_count" in values else {}),
            "run_documents": partitions, "figures": dg.MetadataValue.json(rest),
            "previews": f"on runs over up to {PREVIEW_PARTITIONS} documents"}


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
