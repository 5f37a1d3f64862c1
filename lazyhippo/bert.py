"""A BERT encoder forward pass in numpy: runs the packaged MiniLM weights (safetensors) without torch.

Inference only, float32, batched by length so padding stays small. Attention masks padded keys; the
output is the last hidden state, pooled by the caller. Enough for sentence-transformers BERT models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    x = x - mu
    var = np.einsum("...i,...i->...", x, x)[..., None] / x.shape[-1]
    return x * (w / np.sqrt(var + eps)) + b


def _gelu(x: np.ndarray) -> np.ndarray:
    """tanh approximation of BERT's erf GELU (differs by <1e-3, several times faster in numpy)."""
    return 0.5 * x * (1.0 + np.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


class BertEncoder:
    """Loads `config.json`, `tokenizer.json` and `model.safetensors` from a sentence-transformers folder."""

    def __init__(self, model_dir: Path, max_tokens: int = 256):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        cfg = json.loads((model_dir / "config.json").read_text())
        self.heads = int(cfg["num_attention_heads"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.max_tokens = min(max_tokens, int(cfg["max_position_embeddings"]))
        w = {k: v.astype(np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
        w = {k.removeprefix("bert."): v for k, v in w.items()}
        self.word = w["embeddings.word_embeddings.weight"]
        self.pos = w["embeddings.position_embeddings.weight"]
        self.type0 = w["embeddings.token_type_embeddings.weight"][0]
        self.emb_ln = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(int(cfg["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            g = lambda n: w[p + n]  # noqa: E731
            qkv_w = np.concatenate([g(f"attention.self.{n}.weight") for n in ("query", "key", "value")]).T.copy()
            qkv_b = np.concatenate([g(f"attention.self.{n}.bias") for n in ("query", "key", "value")])
            self.layers.append((qkv_w, qkv_b, g("attention.output.dense.weight").T.copy(), g("attention.output.dense.bias"),
                                g("attention.output.LayerNorm.weight"), g("attention.output.LayerNorm.bias"),
                                g("intermediate.dense.weight").T.copy(), g("intermediate.dense.bias"),
                                g("output.dense.weight").T.copy(), g("output.dense.bias"),
                                g("output.LayerNorm.weight"), g("output.LayerNorm.bias")))
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_tokens)

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def hidden(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """(batch, seq) ids and 0/1 mask -> (batch, seq, hidden) last hidden state."""
        b, n = ids.shape
        x = self.word[ids] + self.pos[:n] + self.type0
        x = _layer_norm(x, *self.emb_ln, self.eps)
        h = x.shape[-1]
        hd = h // self.heads
        neg = ((1.0 - mask[:, None, None, :]) * -1e9).astype(np.float32)
        scale = np.float32(1.0 / np.sqrt(hd))
        for qkv_w, qkv_b, o_w, o_b, ln1w, ln1b, i_w, i_b, f_w, f_b, ln2w, ln2b in self.layers:
            qkv = (x.reshape(b * n, h) @ qkv_w + qkv_b).reshape(b, n, 3, self.heads, hd)
            q = np.ascontiguousarray(qkv[:, :, 0].transpose(0, 2, 1, 3))  # contiguous: batched BLAS
            k = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1))
            v = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3))
            s = np.matmul(q, k) * scale + neg
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            ctx = np.matmul(s, v).transpose(0, 2, 1, 3).reshape(b * n, h)
            x = _layer_norm((ctx @ o_w + o_b).reshape(b, n, h) + x, ln1w, ln1b, self.eps)
            inter = _gelu(x.reshape(b * n, h) @ i_w + i_b)
            x = _layer_norm((inter @ f_w + f_b).reshape(b, n, h) + x, ln2w, ln2b, self.eps)
        return x

    def mean_pooled(self, ids: Sequence[Sequence[int]], batch_tokens: int = 8192) -> np.ndarray:
        """Mean of the last hidden state over real tokens, one row per sequence. Sequences are sorted by
        length and packed into batches of about `batch_tokens` tokens."""
        out = np.zeros((len(ids), self.word.shape[1]), dtype=np.float32)
        order = np.argsort([len(s) for s in ids], kind="stable")
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(ids[order[end]]) <= batch_tokens:
                end += 1
            rows = order[start:end]
            n = max(1, max(len(ids[r]) for r in rows))
            arr = np.zeros((len(rows), n), dtype=np.int64)
            mask = np.zeros((len(rows), n), dtype=np.float32)
            for j, r in enumerate(rows):
                arr[j, :len(ids[r])] = ids[r]
                mask[j, :len(ids[r])] = 1.0
            hid = self.hidden(arr, mask)
            out[rows] = np.einsum("bnh,bn->bh", hid, mask) / np.maximum(mask.sum(1, keepdims=True), 1.0)
            start = end
        return out
