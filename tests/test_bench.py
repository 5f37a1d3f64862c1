"""Issues 5 and 10: metric functions on hand-made rankings, `lazyhippo bench retrieval` end to end on a slice,
scoring by passage id when titles repeat, and shared sets by name."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lazyhippo.evaluate.bench import (
    all_supporting_at_k,
    dataset_files,
    distinct,
    gold_key,
    passage_id,
    passage_key,
    percentile_ms,
    recall_at_k,
    split_of,
)
from lazyhippo_dagster.cli import app
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
    assert set(result["halves"]["local"]) == {split_of(q["question"]) for q in json.loads((wiki_slice / "questions.json").read_text())}
    confirm = CliRunner().invoke(app, [*args, "--split", "confirm"])
    assert confirm.exit_code == 0, confirm.output
    rows = json.loads((tmp_path / "out.json").read_text())["per_question"]["local"]
    assert rows and {split_of(r["question"]) for r in rows} == {"confirm"}
    assert [r for r in result["per_question"]["local"] if split_of(r["question"]) == "confirm"] == rows
    bad = CliRunner().invoke(app, [*args, "--split", "dev"])
    assert bad.exit_code == 2 and "unknown split" in bad.output


def test_bench_retrieval_takes_query_settings(wiki_slice, tmp_path, monkeypatch):
    from lazyhippo.evaluate import bench

    cfg = bench.query_config(["graph.synonym_min_score=0.6", "global.level_min_score=0", "multi_hop.levels=2",
                              "subquestions=true"])
    assert cfg.graph.synonym_min_score == 0.6 and cfg.global_.level_min_score == 0 and cfg.multi_hop.levels == 2
    assert cfg.subquestions is True
    assert bench.query_config([]) is None
    for bad in ("graph.no_such_field=1", "graph=1", "nowhere.x=1", "nowhere=1"):
        with pytest.raises(ValueError):
            bench.query_config([bad])
    out = CliRunner().invoke(app, ["bench", "retrieval", "--set", "local.nothing=1", "--workdir", str(tmp_path)])
    assert out.exit_code == 2 and "--set" in out.output
    seen = []
    real = bench.retrieval_rankers
    monkeypatch.setattr(bench, "retrieval_rankers", lambda *a, **kw: seen.append(kw["config"]) or real(*a, **kw))
    args = ["bench", "retrieval", "--corpus", str(wiki_slice / "corpus.jsonl"), "--questions",
            str(wiki_slice / "questions.json"), "--workdir", str(tmp_path / "ws"), "--set", "local.damping=0.6"]
    assert CliRunner().invoke(app, args).exit_code == 0
    assert seen[-1].local.damping == 0.6


def test_gold_by_id_when_every_question_has_ids():
    by_id = [{"supporting_titles": ["T"], "supporting_ids": ["a"]}, {"supporting_titles": ["U"], "supporting_ids": ["b"]}]
    assert gold_key(by_id) == "supporting_ids"
    assert gold_key(by_id + [{"supporting_titles": ["V"]}]) == "supporting_titles"
    assert passage_id("corpus.jsonl#musique-00017") == "musique-00017"
    assert passage_id("notes/a.md") == "notes/a.md"


def test_file_recall_counts_distinct_source_files_in_chunk_order():
    """gitdocs scoring: chunks map to their source file, each file counts at its first chunk; recall@5 is the
    share of gold files among the first 5 distinct files, all-gold@8 whether every gold file is in the first 8."""
    questions = [{"question": "q", "gold_files": ["howto/a.txt", "b.txt"], "supporting_titles": ["A"]}]
    assert gold_key(questions) == "gold_files"
    assert gold_key(questions + [{"question": "r", "supporting_titles": ["B"]}]) == "supporting_titles"
    chunks = [("c.txt", "C"), ("c.txt", "C"), ("d.txt", "D"), ("howto/a.txt", "A"), ("c.txt", "C"), ("e.txt", "E"),
              ("f.txt", "F"), ("g.txt", "G"), ("b.txt", "B")]
    ranked = [passage_key(source, title, "gold_files") for source, title in chunks]
    assert distinct(ranked)[:5] == ["c.txt", "d.txt", "howto/a.txt", "e.txt", "f.txt"]
    assert recall_at_k(ranked, ["howto/a.txt", "b.txt"], 5) == 0.5   # b.txt is the 7th distinct file
    assert all_supporting_at_k(ranked, ["howto/a.txt", "b.txt"], 8) == 1.0
    assert all_supporting_at_k(ranked, ["howto/a.txt", "b.txt"], 6) == 0.0
    assert passage_key("corpus.jsonl#p7", "T", "supporting_ids") == "p7"
    assert passage_key("corpus.jsonl#p7", "T", "supporting_titles") == "T"


def test_bench_scores_a_folder_corpus_by_file_per_hops(tmp_path):
    """A folder of documents is indexed as a folder; questions with `gold_files` are scored by source file, with
    single-file and two-file questions (`hops`) reported apart, for every route asked and BM25."""
    src = tmp_path / "src"
    (src / "howto").mkdir(parents=True)
    topics = {"rebase.txt": "Rebasing replays commits onto another base; the interactive mode edits the todo list.",
              "howto/bisect.txt": "Bisecting finds the commit that introduced a bug by binary search over history.",
              "stash.txt": "Stashing records the working directory state and reverts to the HEAD commit.",
              **{f"page{i}.txt": f"Page {i} describes the option number {i} of the tool and its default value."
                 for i in range(8)}}
    for name, text in topics.items():
        (src / name).write_text(f"{text}\n\n{text} More words follow here about this one topic only.\n")
    questions = [{"question": "How does bisecting find the commit that introduced a bug?", "gold_files": ["howto/bisect.txt"],
                  "hops": 1},
                 {"question": "What does stashing record, and how does rebasing replay commits?",
                  "gold_files": ["stash.txt", "rebase.txt"], "hops": 2}]
    (tmp_path / "q.json").write_text(json.dumps(questions))
    out = CliRunner().invoke(app, ["bench", "retrieval", "--corpus", str(src), "--questions", str(tmp_path / "q.json"),
                                   "--route", "auto,local", "--workdir", str(tmp_path / "ws"), "--json", str(tmp_path / "out.json")])
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["scored_by"] == "gold_files" and result["routes"] == ["auto", "local"]
    assert set(result["methods"]) == {"auto", "local", "bm25", "dense"}
    for method in ("local", "bm25"):
        first = result["per_question"][method][0]
        assert first["retrieved"][0] == "howto/bisect.txt", method
        assert set(result["by_hops"][method]) == {"hops 1", "hops 2"}
    assert result["methods"]["bm25"]["recall_at_5"] == 1.0
    assert sum(result["routes_used"]["auto"].values()) == 2


def test_unknown_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset 'squad'"):
        dataset_files("squad", tmp_path)
    with pytest.raises(FileNotFoundError, match="musique"):
        dataset_files("musique", tmp_path)
    out = CliRunner().invoke(app, ["bench", "retrieval", "--dataset", "squad", "--workdir", str(tmp_path)])
    assert out.exit_code == 2 and "unknown dataset" in out.output


def test_bench_scores_by_passage_id_when_titles_repeat(tmp_path):
    """Two passages share a title; only one is gold. Scoring by title would credit the wrong one."""
    rows = [{"id": "p1", "title": "Springfield", "text": "Springfield in Illinois is the state capital, home of Abraham Lincoln."},
            {"id": "p2", "title": "Springfield", "text": "Springfield in Massachusetts is where basketball was invented by James Naismith."},
            *({"id": f"x{i}", "title": f"Town {i}", "text": f"Town {i} is a small village known for its mill and river."}
              for i in range(20))]
    (tmp_path / "corpus.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    questions = [{"question": "Who invented basketball in Springfield?", "supporting_titles": ["Springfield"],
                  "supporting_ids": ["p2"]}]
    (tmp_path / "q.json").write_text(json.dumps(questions))
    args = ["bench", "retrieval", "--corpus", str(tmp_path / "corpus.jsonl"), "--questions", str(tmp_path / "q.json"),
            "--workdir", str(tmp_path / "ws"), "--json", str(tmp_path / "out.json")]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["scored_by"] == "supporting_ids"
    for method, rows_ in result["per_question"].items():
        retrieved = rows_[0]["retrieved"]
        assert all(r in {"p1", "p2"} or r.startswith("x") for r in retrieved), method
        assert rows_[0]["recall_at_2"] == float("p2" in retrieved[:2]), method
    assert result["methods"]["bm25"]["recall_at_2"] == 1.0  # "basketball" only occurs in p2


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


def test_summary_row_has_both_halves_the_baselines_and_index_time():
    from lazyhippo.evaluate.bench import summary_row

    m = lambda r2, r5, a8: {"recall_at_2": r2, "recall_at_5": r5, "all_supporting_at_8": a8, "latency_p50_ms": 4.04}  # noqa: E731
    half = lambda n, r2, r5, a8: {"questions": n, **m(r2, r5, a8)}  # noqa: E731
    result = {"route": "local", "index_seconds": 12.34, "reused": True,
              "methods": {"local": m(0.5, 0.75, 0.5), "bm25": m(0.1, 0.4, 0.0), "dense": m(0.2, 0.3, 0.0)},
              "halves": {"local": {"tune": half(3, 0.4, 0.7, 0.3333), "confirm": half(2, 0.6, 0.8, 0.6667)},
                         "bm25": {"tune": half(3, 0.1, 0.3, 0.0), "confirm": half(2, 0.1, 0.5, 0.5)}}}
    assert summary_row("musique", result) == {
        "set": "musique", "n t/c": "3/2", "r@2 t": 0.4, "r@2 c": 0.6, "r@5 t": 0.7, "r@5 c": 0.8, "all@8 t": 0.333,
        "all@8 c": 0.667, "bm25 r@5 t": 0.3, "bm25 r@5 c": 0.5, "bm25 all@8 t": 0.0, "bm25 all@8 c": 0.5,
        "dense r@5": 0.3, "p50 ms": 4.0, "index s": 12.3, "reused": True}
    result["halves"]["local"].pop("confirm")
    assert summary_row("musique", result)["all@8 c"] == "-" and summary_row("musique", result)["n t/c"] == "3/0"


def test_bench_workspace_is_rebuilt_when_the_embedding_model_changes(tmp_path, monkeypatch):
    """Same corpus and settings but a new distillation (new model name): the stamp no longer matches."""
    import lazyhippo.evaluate.bench as bench

    corpus = tmp_path / "c.jsonl"
    corpus.write_text(json.dumps({"id": "a", "title": "A", "text": "Alpha beta gamma."}) + "\n")
    (tmp_path / "ws").mkdir()
    calls = []
    monkeypatch.setattr("lazyhippo.index.run_index", lambda settings, **kw: calls.append(settings))
    bench.ensure_index(corpus, tmp_path / "ws")
    assert bench.ensure_index(corpus, tmp_path / "ws")[1]["reused"] is True and len(calls) == 1
    monkeypatch.setattr(bench, "embedding_model_name", lambda kind, model="": "static-minilm-256-next")
    assert bench.ensure_index(corpus, tmp_path / "ws")[1]["reused"] is False and len(calls) == 2
    monkeypatch.setattr("lazyhippo.models.extractors.NlpExtractor.prompt_version", "nlp-next")  # extraction changed
    assert bench.ensure_index(corpus, tmp_path / "ws")[1]["reused"] is False and len(calls) == 3
    assert bench.ensure_index(corpus, tmp_path / "ws")[1]["reused"] is True and len(calls) == 3


def test_split_is_a_deterministic_disjoint_half_covering_every_question():
    """The same question always lands in the same half; the halves are disjoint, cover the set, and each
    holds about half of it (on the shared sets' sizes)."""
    from lazyhippo.evaluate.bench import select_split, split_of

    questions = [{"question": f"Who directed film number {i}?"} for i in range(400)]
    tune, confirm = select_split(questions, "tune"), select_split(questions, "confirm")
    assert select_split(questions, "tune") == tune and [split_of(q["question"]) for q in tune] == ["tune"] * len(tune)
    texts = lambda qs: {q["question"] for q in qs}  # noqa: E731
    assert not texts(tune) & texts(confirm) and texts(tune) | texts(confirm) == texts(questions)
    assert select_split(questions, "all") == questions
    assert 160 <= len(tune) <= 240
    assert split_of("  Who directed film number 3? ") == split_of("Who directed film number 3?")
    with pytest.raises(ValueError, match="unknown split 'dev'"):
        select_split(questions, "dev")


def _rows(values: dict[str, tuple[float, float, float]]) -> list[dict]:
    return [{"question": q, "recall_at_2": a, "recall_at_5": b, "all_supporting_at_8": c} for q, (a, b, c) in values.items()]


def _confirm_questions(n: int) -> list[str]:
    from lazyhippo.evaluate.bench import split_of

    return [q for q in (f"question {i}" for i in range(100)) if split_of(q) == "confirm"][:n]


def test_keep_rule_allows_one_lost_question_and_needs_a_gain():
    from lazyhippo.evaluate.bench import keep_change, split_of

    qs = _confirm_questions(4)
    tune_q = next(q for q in (f"other {i}" for i in range(100)) if split_of(q) == "tune")
    base = {"a": _rows({**{q: (0.5, 1.0, 1.0) for q in qs}, tune_q: (1.0, 1.0, 1.0)}),
            "b": _rows({q: (0.5, 0.5, 0.0) for q in qs})}
    one_lost = {"a": _rows({**{q: (0.5, 1.0, 1.0) for q in qs[1:]}, qs[0]: (0.5, 1.0, 0.0), tune_q: (0.0, 0.0, 0.0)}),
                "b": _rows({**{q: (0.5, 0.5, 0.0) for q in qs[1:]}, qs[0]: (1.0, 1.0, 1.0)})}
    verdict = keep_change(base, one_lost)
    assert verdict["keep"] and verdict["gained"] and verdict["delta_questions"]["a all_supporting_at_8"] == -1.0
    two_lost = {**one_lost, "a": _rows({**{q: (0.5, 1.0, 0.0) for q in qs[:2]}, **{q: (0.5, 1.0, 1.0) for q in qs[2:]}})}
    assert keep_change(base, two_lost) == {**keep_change(base, two_lost), "keep": False, "lost": ["a all_supporting_at_8"]}
    assert keep_change(base, base)["keep"] is False  # no gain: nothing to keep
    assert keep_change(base, base, require_gain=False)["keep"] is True  # a removal that changes nothing stays removed
    with pytest.raises(ValueError, match="'b' is missing"):
        keep_change(base, {"a": base["a"]})


def test_bench_keep_command_reads_two_bench_outputs(tmp_path):
    qs = _confirm_questions(2)
    result = lambda rows: {"route": "local", "corpus": "c.jsonl", "methods": {}, "per_question": {"local": rows}}  # noqa: E731
    (tmp_path / "base.json").write_text(json.dumps(result(_rows({q: (0.0, 0.0, 0.0) for q in qs}))))
    (tmp_path / "gain.json").write_text(json.dumps(result(_rows({q: (1.0, 1.0, 1.0) for q in qs}))))
    out = CliRunner().invoke(app, ["bench", "keep", str(tmp_path / "base.json"), str(tmp_path / "gain.json")])
    assert out.exit_code == 0 and json.loads(out.output)["keep"] is True
    out = CliRunner().invoke(app, ["bench", "keep", str(tmp_path / "gain.json"), str(tmp_path / "base.json")])
    assert out.exit_code == 1 and json.loads(out.output)["lost"] == ["c.jsonl recall_at_2", "c.jsonl recall_at_5",
                                                                     "c.jsonl all_supporting_at_8"]


def test_bench_same_lists_the_questions_whose_top_k_moved(tmp_path):
    from lazyhippo.evaluate.bench import ranking_changes

    row = lambda q, ids: {"question": q, "retrieved": ids}  # noqa: E731
    base = {"a": [row("q1", ["p1", "p2", "p3"]), row("q2", ["p4", "p5"])], "b": [row("q3", ["p6"])]}
    swapped = {"a": [row("q2", ["p4", "p5"]), row("q1", ["p2", "p1", "p3"])], "b": [row("q3", ["p6"])]}
    assert ranking_changes(base, base) == {"same": True, "sets": {"a": {"questions": 2, "same": 2, "moved": []},
                                                                   "b": {"questions": 1, "same": 1, "moved": []}}}
    assert ranking_changes(base, swapped)["sets"]["a"]["moved"] == ["q1"]  # the order counts
    assert ranking_changes(base, swapped, k=1)["sets"]["a"]["moved"] == ["q1"]
    tail = {**base, "a": [row("q1", ["p1", "p2", "p9"]), row("q2", ["p4", "p5"])]}
    assert ranking_changes(base, tail, k=2)["same"] and not ranking_changes(base, tail, k=3)["same"]
    with pytest.raises(ValueError, match="different questions"):
        ranking_changes(base, {**base, "b": [row("q4", ["p6"])]})
    result = lambda rows: {"route": "local", "corpus": "c.jsonl", "methods": {}, "per_question": {"local": rows}}  # noqa: E731
    (tmp_path / "base.json").write_text(json.dumps(result(base["a"])))
    (tmp_path / "new.json").write_text(json.dumps(result(swapped["a"])))
    out = CliRunner().invoke(app, ["bench", "same", str(tmp_path / "base.json"), str(tmp_path / "base.json")])
    assert out.exit_code == 0 and json.loads(out.output)["same"] is True
    out = CliRunner().invoke(app, ["bench", "same", str(tmp_path / "base.json"), str(tmp_path / "new.json")])
    assert out.exit_code == 1 and json.loads(out.output)["sets"]["c.jsonl"]["moved"] == ["q1"]


def test_bench_retrieval_llm_needs_an_endpoint_and_reports_its_tokens(wiki_slice, tmp_path, monkeypatch):
    from tests.loopback import FakeOpenAI

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("LAZYHIPPO_LLM", raising=False)
    args = ["bench", "retrieval", "--corpus", str(wiki_slice / "corpus.jsonl"), "--questions",
            str(wiki_slice / "questions.json"), "--workdir", str(tmp_path / "ws"), "--json", str(tmp_path / "out.json")]
    out = CliRunner().invoke(app, [*args, "--llm"])
    assert out.exit_code == 2 and "no LLM endpoint is configured" in out.output
    with FakeOpenAI(lambda p: '{"keep": [1, 2]}' if "Candidate facts" in p else '{"done": true}') as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("LAZYHIPPO_LLM_MODEL", "m")
        out = CliRunner().invoke(app, [*args, "--llm", "--llm-rounds", "2"])
    assert out.exit_code == 0, out.output
    usage = {u["operation"]: u for u in json.loads((tmp_path / "out.json").read_text())["llm"]["usage"]}
    assert usage["recognition"]["calls"] == 5 and usage["bridge"]["calls"] == 5  # one each per question


def test_bench_index_reports_the_event_rows_of_a_run_and_its_time_outside_steps(tmp_path):
    import dagster as dg

    from lazyhippo.settings import SAMPLE_CORPUS
    from lazyhippo_dagster.bench_index import dagster_cost
    from lazyhippo_dagster.runner import index_run, run_config

    instance = dg.DagsterInstance.ephemeral()
    config = run_config({"lazyhippo": {"home": str(tmp_path), "source": str(SAMPLE_CORPUS)}})
    run = index_run(instance, tmp_path, config, {}, "default")
    assert run.success
    wall = instance.get_run_stats(run.run_id).end_time - instance.get_run_stats(run.run_id).start_time
    cost = dagster_cost(instance, run.run_id, wall)
    assert cost["event_rows"] == len(instance.all_logs(run.run_id)) > 20
    assert 0 < cost["outside_steps_share"] < 0.5  # the steps take most of the run
    assert dagster_cost(instance, run.run_id, wall * 2)["outside_steps_share"] > 0.5  # the span outside counts


def test_cli_latency_alternates_with_a_baseline_build_and_reports_the_load(sample_settings, tmp_path, monkeypatch):
    """`bench query --cli N --baseline EXE`: the other build's commands run in turn with this build's, on the same
    questions, so both see the same load; both sets of figures, their ratio and the load average come back."""
    import shutil
    import stat

    from lazyhippo.evaluate.bench import run_cli_latency
    from lazyhippo.settings import Settings

    home = tmp_path / "home"
    shutil.copytree(sample_settings.home, home, ignore=shutil.ignore_patterns("dagster", "*.lock"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "dagster"))
    order = tmp_path / "order"
    baseline = tmp_path / "lazyhippo-before"
    baseline.write_text(f"#!/bin/sh\necho \"baseline $7\" >> {order}\nls -A $3/published >> {order}\n")
    baseline.chmod(baseline.stat().st_mode | stat.S_IXUSR)
    questions = [{"question": "Who founded the Marlow Observatory?"}, {"question": "What did Tomas Reyes design?"}]
    result = run_cli_latency(Settings(home=home), questions, 1, baseline)
    # the baseline reads its own copy of the home, without this build's index cache, removed afterwards
    assert order.read_text().splitlines() == ["baseline Who founded the Marlow Observatory?", "default.duckdb",
                                              "baseline What did Tomas Reyes design?", "default.duckdb"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dagster", "home", "lazyhippo-before", "order"]
    assert {"first_ms", "p50_ms", "p95_ms", "cpu_p50_ms", "baseline_first_ms", "baseline_p50_ms", "baseline_p95_ms",
            "baseline_cpu_p50_ms", "load_before", "load_after"} <= set(result)
    assert result["p50_ratio"] == pytest.approx(result["p50_ms"] / result["baseline_p50_ms"])
    assert result["cpu_p50_ratio"] == pytest.approx(result["cpu_p50_ms"] / result["baseline_cpu_p50_ms"])
    assert result["p50_ms"] > result["baseline_p50_ms"] > 0  # a whole query against a shell's echo
    assert result["cpu_p50_ms"] > 100 * result["baseline_cpu_p50_ms"]


def test_cli_latency_measures_the_warm_daemon_beside_the_cold_command(sample_settings, tmp_path, monkeypatch):
    """`bench query --cli N --warm`: the same commands through the home's query daemon, in turn with cold ones
    that neither use nor start it; the daemon's CPU per query comes back, and it is gone afterwards."""
    import shutil

    import dagster as dg

    from lazyhippo.evaluate.bench import run_cli_latency
    from lazyhippo.settings import Settings

    home = tmp_path / "home"
    shutil.copytree(sample_settings.home, home, ignore=shutil.ignore_patterns("dagster", "*.lock"))
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    monkeypatch.delenv("LAZYHIPPO_QUERY_DAEMON", raising=False)
    questions = [{"question": "Who founded the Marlow Observatory?"}, {"question": "What did Tomas Reyes design?"}]
    result = run_cli_latency(Settings(home=home), questions, 1, warm=True)
    assert {"p50_ms", "cpu_p50_ms", "warm_first_ms", "warm_p50_ms", "warm_cpu_p50_ms", "warm_daemon_cpu_p50_ms",
            "load_before", "load_after"} <= set(result)
    assert result["warm_daemon_cpu_p50_ms"] > 0 and result["warm_cpu_p50_ms"] < result["cpu_p50_ms"] / 3
    assert not (home / "query-daemon.json").exists()
    pids = {r.tags["lazyhippo/pid"] for r in dg.DagsterInstance.from_config(str(home / "dagster")).get_runs()}
    assert len(pids) == 3  # two cold processes, and the daemon for both warm ones


def test_bench_index_stages_times_every_stage_of_one_library_index(tmp_path):
    """Wall and process-tree CPU seconds per stage, the whole run's MB a minute, and the load average beside them."""
    from lazyhippo.index import STAGE_NAMES
    from lazyhippo.settings import SAMPLE_CORPUS

    out = tmp_path / "stages.json"
    result = CliRunner().invoke(app, ["bench", "index", "--stages", "--corpus", str(SAMPLE_CORPUS), "--workdir",
                                      str(tmp_path / "w"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    got = json.loads(out.read_text())
    assert list(got["stages"])[:len(STAGE_NAMES)] == list(STAGE_NAMES)
    assert all(got["stages"][s]["cpu_seconds"] >= 0 and got["stages"][s]["seconds"] >= 0 for s in STAGE_NAMES)
    assert got["stages"]["extractions"]["cpu_seconds"] > 0 and 0 < got["cpu_seconds"]
    assert got["mb_per_minute"] == pytest.approx(got["mb"] / got["seconds"] * 60, abs=0.01) and len(got["load_start"]) == 3
    assert (tmp_path / "w" / "home" / "published").is_dir()
    missing = CliRunner().invoke(app, ["bench", "index", "--stages", "--corpus", str(tmp_path / "nope.jsonl")])
    assert missing.exit_code == 2 and "nope.jsonl does not exist" in " ".join(missing.output.split())


def test_bench_memory_runs_every_stage_on_a_copy_and_leaves_its_answers(sample_settings, tmp_path):
    """`lazyhippo bench memory`: every step measured in turn on a copy of an indexed home, which still answers."""
    import shutil

    from lazyhippo_dagster.bench_memory import stage_memory

    home = tmp_path / "copy"
    shutil.copytree(sample_settings.home, home, ignore=shutil.ignore_patterns("*.lock"))
    rows = stage_memory(home, sample_settings.namespace)
    assert [r["step"] for r in rows][:2] == ["documents", "extraction batches"] and rows[-1]["step"] == "publishing"
    assert all(r["peak MB"] >= min(r["before MB"], r["after MB"]) > 0 for r in rows)
    out = CliRunner().invoke(app, ["bench", "memory", str(tmp_path / "nowhere")])
    assert out.exit_code == 2 and "warehouse.duckdb missing" in out.output
