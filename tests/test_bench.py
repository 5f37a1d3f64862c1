"""Issue 5: metric functions on hand-made rankings, and `lazyhippo bench retrieval` end to end on a slice."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lazyhippo.bench import all_supporting_at_k, distinct, percentile_ms, recall_at_k
from pipelines.cli import app
from tests.services_fixtures import namespaces, neo4j_store  # noqa: F401 - fixtures


def test_metrics_on_hand_made_rankings():
    ranked = ["A", "A", "B", "C", "D", "E", "F", "G", "H"]
    assert distinct(ranked)[:3] == ["A", "B", "C"]
    assert recall_at_k(ranked, ["A", "D"], 2) == 0.5       # duplicates do not take a slot
    assert recall_at_k(ranked, ["A", "D"], 5) == 1.0
    assert recall_at_k(["X"], ["A", "B", "C", "D"], 5) == 0.0
    assert all_supporting_at_k(ranked, ["A", "H"], 8) == 1.0
    assert all_supporting_at_k(ranked, ["A", "Z"], 8) == 0.0
    assert percentile_ms([0.001, 0.002, 0.003], 50) == pytest.approx(2.0)


@pytest.fixture(scope="module")
def wiki_slice(wiki_dataset, tmp_path_factory):
    """A few hundred passages: the gold passages of 5 dev questions plus distractors."""
    out = tmp_path_factory.mktemp("slice")
    questions = json.loads((wiki_dataset / "questions_dev.json").read_text())[:5]
    gold = {t for q in questions for t in q["supporting_titles"]}
    rows = [json.loads(line) for line in (wiki_dataset / "corpus.jsonl").read_text().splitlines()]
    chosen = [r for r in rows if r["title"] in gold] + [r for r in rows if r["title"] not in gold][:300]
    (out / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in chosen) + "\n")
    (out / "questions.json").write_text(json.dumps(questions))
    return out


def test_bench_retrieval_end_to_end_on_a_slice(wiki_slice, tmp_path):
    args = ["bench", "retrieval", "--corpus", str(wiki_slice / "corpus.jsonl"), "--questions",
            str(wiki_slice / "questions.json"), "--workdir", str(tmp_path / "ws"), "--json", str(tmp_path / "out.json")]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    headline = json.loads(first.stdout.strip().splitlines()[-1])
    assert {"local_recall_at_2", "local_recall_at_5", "local_all_supporting_at_8", "local_latency_p50_ms",
            "dense_recall_at_5", "bm25_recall_at_5", "index_seconds"} <= set(headline)
    result = json.loads((tmp_path / "out.json").read_text())
    assert set(result["methods"]) == {"local", "bm25", "dense"}
    for m in result["methods"].values():
        assert {"recall_at_2", "recall_at_5", "all_supporting_at_8", "latency_p50_ms", "latency_p95_ms"} <= set(m)
        assert all(0.0 <= m[k] <= 1.0 for k in ("recall_at_2", "recall_at_5", "all_supporting_at_8"))
    assert len(result["per_question"]["local"]) == 5
    assert all(1 <= len(r["retrieved"]) <= 8 for r in result["per_question"]["local"])
    assert result["index_seconds"] > 0 and result["reused"] is False
    assert result["methods"]["local"]["recall_at_5"] >= 0.7  # gold passages are findable in a small slice
    again = CliRunner().invoke(app, args)
    assert json.loads(again.stdout.strip().splitlines()[-1])["reused_index"] is True


@pytest.mark.services
def test_bench_retrieval_on_neo4j_ranks_like_the_embedded_store(wiki_slice, tmp_path, monkeypatch, neo4j_store,
                                                               namespaces):  # noqa: F811
    """`bench retrieval --graph-store neo4j` pushes the index to the server and ranks through it: the same
    passages, in the same order, as the embedded store on the same index."""
    monkeypatch.setenv("LAZYHIPPO_NAMESPACE", namespaces("bench"))
    args = ["bench", "retrieval", "--corpus", str(wiki_slice / "corpus.jsonl"), "--questions",
            str(wiki_slice / "questions.json"), "--workdir", str(tmp_path / "ws")]
    results = {}
    for store in ("embedded", "neo4j"):
        out = CliRunner().invoke(app, [*args, "--graph-store", store, "--json", str(tmp_path / f"{store}.json")])
        assert out.exit_code == 0, out.output
        results[store] = json.loads((tmp_path / f"{store}.json").read_text())
    emb, neo = results["embedded"], results["neo4j"]
    assert neo["graph_store"] == "neo4j" and neo["reused"] is True
    assert [r["retrieved"] for r in neo["per_question"]["local"]] == [r["retrieved"] for r in emb["per_question"]["local"]]
    for k in ("recall_at_2", "recall_at_5", "all_supporting_at_8"):
        assert neo["methods"]["local"][k] == emb["methods"]["local"][k]
