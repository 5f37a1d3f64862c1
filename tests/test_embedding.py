"""Issue 10: embedder profiles without torch. The ONNX BERT forward pass reproduces the packaged MiniLM as
sentence-transformers runs it; the static profile is distilled from it; an unknown profile is a clear error."""

from __future__ import annotations

import numpy as np
import pytest

from lazyhippo.embedding import PROFILES, MiniLM, _encoder, get_embedder

# sentence-transformers 5 (torch) on the same packaged weights, normalized, first 6 dimensions
REFERENCE = {"Who directed the film Titanic?": [-0.05580, -0.01020, -0.00149, 0.09091, 0.00085, 0.04373],
             "lazyhippo": [-0.01501, 0.09305, 0.02844, 0.01208, -0.05938, -0.03646]}


def test_minilm_profile_matches_sentence_transformers():
    vecs = get_embedder("minilm").embed(list(REFERENCE))
    assert vecs.shape == (2, 384) and vecs.dtype == np.float32
    np.testing.assert_allclose(vecs[:, :6], np.array(list(REFERENCE.values())), atol=2e-4)


def test_batching_and_padding_do_not_change_vectors():
    texts = ["short", "a much longer sentence about the river Thames flowing through London to the sea", "mid length text"]
    together = MiniLM().embed(texts)
    alone = np.vstack([MiniLM().embed([t]) for t in texts])
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_profiles_rank_a_paraphrase_above_an_unrelated_text():
    for kind in ("static-minilm", "minilm"):
        q, para, other = get_embedder(kind).embed(["Who directed Titanic?", "Titanic is a film directed by James Cameron.",
                                                   "The recipe needs two eggs and flour."])
        assert q @ para > q @ other + 0.1, kind


def test_static_profile_is_distilled_from_the_packaged_model():
    emb = get_embedder("static-minilm")
    assert emb.name.startswith("static-minilm")
    assert emb.embed(["anything"]).shape == (1, 256)
    assert emb.embed([]).shape == (0, 256)
    assert _encoder().tokenizer.get_vocab_size() == emb._model.embedding.shape[0]


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="unknown embedder 'bge'.*static-minilm, minilm, openai"):
        get_embedder("bge")
    assert PROFILES[0] == "static-minilm"


def test_settings_profile_reaches_the_index_and_the_query(tmp_path):
    """`Settings(embedder="minilm")` embeds with the transformer at index time, and queries use it too."""
    import json

    from lazyhippo.config import Settings
    from lazyhippo.index import run_index
    from lazyhippo.query import retrieve
    from lazyhippo.warehouse import connect

    rows = [{"id": "a", "title": "Marlow Observatory", "text": "Ada Fenwick founded the Marlow Observatory in 1881."},
            {"id": "b", "title": "River Sell", "text": "The River Sell floods the valley every spring."},
            {"id": "c", "title": "Tomas Reyes", "text": "Tomas Reyes succeeded Ada Fenwick as director of the observatory."}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    settings = Settings(home=tmp_path / "home", source=str(tmp_path / "c.jsonl"), embedder="minilm")
    run_index(settings)
    with connect(settings, read_only=True) as con:
        models = dict(con.execute("SELECT kind, any_value(model) FROM embeddings GROUP BY kind").fetchall())
        dims = {len(v) for (v,) in con.execute("SELECT vector FROM embeddings").fetchall()}
    assert models["chunk"] == models["entity"] == models["fact"] == "minilm-l6-mean" and dims == {384}
    top = retrieve(settings, "When does the river flood?", route="hybrid", top_k=1)
    assert top[0].title == "River Sell"


def test_cli_rejects_an_unknown_profile(tmp_path):
    from typer.testing import CliRunner

    from pipelines.cli import app

    out = CliRunner().invoke(app, ["bench", "retrieval", "--dataset", "musique", "--embedder", "bge", "--workdir", str(tmp_path)])
    assert out.exit_code == 2 and "unknown embedder 'bge'" in out.output
