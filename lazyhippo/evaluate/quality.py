"""Context-quality, theme-coverage and retrieval-quality measures behind the benchmark asset checks.

Each function takes plain data (assembled contexts, texts, rankings) so a test can build a violating
case by hand; the Dagster checks feed them real query results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from lazyhippo.evaluate.bench import all_supporting_at_k, recall_at_k
from lazyhippo.evaluate.checks import CheckResult
from lazyhippo.settings import Settings


def context_quality(contexts: Sequence[dict], budget: int, max_noise_share: float = 0.25) -> CheckResult:
    """contexts: QueryResult.to_dict() rows. Duplicates must be 0, every context within budget."""
    dup = total = noise = over = 0
    citations = []
    for ctx in contexts:
        hashes, texts = set(), set()
        for c in ctx["context"]:
            total += 1
            key = c.get("content_hash") or c["text"].strip()
            dup += key in hashes or c["text"].strip() in texts
            hashes.add(key)
            texts.add(c["text"].strip())
            noise += c.get("noise") is not None
        over += ctx["context_tokens"] > budget
        citations.append(len(ctx["citations"]))
    figures = {"queries": len(contexts), "context_chunks": total,
               "duplicate_chunk_share": dup / total if total else 0.0,
               "over_budget_contexts": over, "noise_chunk_share": noise / total if total else 0.0,
               "mean_citations": sum(citations) / len(citations) if citations else 0.0,
               "min_citations": min(citations, default=0)}
    passed = (bool(contexts) and dup == 0 and over == 0 and figures["noise_chunk_share"] <= max_noise_share
              and figures["min_citations"] >= 1)
    return CheckResult("context_quality", passed, "no duplicate chunk, within budget, few noise chunks, cited", figures)


def theme_coverage(context_text: str, themes: Sequence[str]) -> tuple[float, list[str]]:
    """Share of expected themes named in the assembled context (case-insensitive), and the missing ones."""
    low = context_text.lower()
    missing = [t for t in themes if t.lower() not in low]
    return (1 - len(missing) / len(themes) if themes else 1.0), missing


def themes_outcome(per_question: Sequence[tuple[str, str, Sequence[str]]], threshold: float = 0.9) -> CheckResult:
    """per_question: (question, assembled context text, expected themes)."""
    rows = []
    for question, text, themes in per_question:
        cov, missing = theme_coverage(text, themes)
        rows.append({"question": question, "coverage": cov, "missing": missing})
    mean = sum(r["coverage"] for r in rows) / len(rows) if rows else 0.0
    return CheckResult("theme_coverage", bool(rows) and mean >= threshold, "share of expected themes in the context",
                       {"theme_coverage": mean, "threshold": threshold, "questions": len(rows)}, details=rows)


def retrieval_outcome(rankings: Sequence[tuple[str, Sequence[str], Sequence[str]]], floor: float) -> CheckResult:
    """rankings: (question, ranked passage keys, supporting keys), keys being ids or titles. recall@5 averaged,
    against a floor; recall@2 and all_supporting@8 shown beside it."""
    rows = [{"question": q, "recall_at_2": recall_at_k(ranked, gold, 2), "recall_at_5": recall_at_k(ranked, gold, 5),
             "all_supporting_at_8": all_supporting_at_k(ranked, gold, 8), "retrieved": list(ranked[:5])}
            for q, ranked, gold in rankings]
    mean = {k: sum(r[k] for r in rows) / len(rows) if rows else 0.0 for k in ("recall_at_2", "recall_at_5", "all_supporting_at_8")}
    return CheckResult("retrieval_quality", bool(rows) and mean["recall_at_5"] >= floor, "recall@5 of the local route against a floor",
                       {**mean, "floor": floor, "questions": len(rows)}, details=rows)


def probe_questions(settings: Settings, n: int = 8) -> list[str]:
    """A fixed query set for any corpus: the questions file beside the source if any, else the top entities."""
    qfile = source_file(settings, "questions.json")
    if qfile:
        return [q["question"] for q in json.loads(qfile.read_text())][:n]
    from lazyhippo.stores.warehouse import connect

    with connect(settings, read_only=True) as con:
        names = [r[0] for r in con.execute(
            "SELECT name FROM entities WHERE namespace = ? ORDER BY mention_count DESC, degree DESC, name LIMIT ?",
            [settings.namespace, n]).fetchall()]
    return [f"What do the documents say about {name}?" for name in names]


def source_file(settings: Settings, name: str) -> Path | None:
    src = Path(settings.source)
    path = (src if src.is_dir() else src.parent) / name
    return path if path.exists() else None


RECHECK_SHARE = 0.05  # of the documents, changed since a query check's last evaluation, before it evaluates again


def _check_stage(check: str) -> str:
    return f"check:{check}"


def skip_reason(con, namespace: str, check: str, params: str) -> str | None:
    """Why a query-based check need not evaluate now, or None. Its cost is building the whole query index, not
    its few questions, so it grows with the corpus: after a small change (some documents, under RECHECK_SHARE
    of them, since its last evaluation with the same parameters) it waits for more change. With nothing changed
    it evaluates (it was asked to again)."""
    from lazyhippo.stages.incremental import PARAMS, fingerprint, read_inputs

    before = read_inputs(con, namespace, _check_stage(check))
    if not before or before.get(PARAMS) != fingerprint(params):
        return None
    now = {d: fingerprint(h) for d, h in con.execute("SELECT doc_id, content_hash FROM documents WHERE namespace = ?",
                                                     [namespace]).fetchall()}
    changed = sum(1 for d in (set(now) | set(before)) - {PARAMS} if now.get(d) != before.get(d))
    if 0 < changed < RECHECK_SHARE * len(now):
        return (f"{changed} of {len(now)} documents changed since its last evaluation, under {RECHECK_SHARE:.0%}: "
                "evaluated again once more of them change")
    return None


def record_evaluation(con, namespace: str, check: str, params: str) -> None:
    """The documents a check evaluated on (what skip_reason compares with)."""
    from lazyhippo.stages.incremental import PARAMS, write_inputs
    from lazyhippo.stores.warehouse import transaction

    docs = dict(con.execute("SELECT doc_id, content_hash FROM documents WHERE namespace = ?", [namespace]).fetchall())
    with transaction(con):
        write_inputs(con, namespace, _check_stage(check), {**docs, PARAMS: params})
