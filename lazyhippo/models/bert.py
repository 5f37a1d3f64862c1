"""A BERT sentence encoder run by ONNX Runtime, built from the packaged MiniLM weights (safetensors).

The weights are written once per machine into an ONNX graph of the standard BERT forward pass (exact erf
GELU, masked attention, mean pooling inside the graph) and cached; ONNX Runtime's fused CPU kernels run it
about 3.5x faster than the same pass in numpy, with no torch and nothing downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from lazyhippo.logs import without_records_from
from lazyhippo.settings import environment

GRAPH_VERSION = "bert-onnx-v1"  # bump when the graph below changes: cached graphs are rebuilt


def build_onnx(model_dir: Path, out: Path) -> None:
    """Write `model_dir`'s BERT as an ONNX graph: (input_ids, attention_mask) -> mean-pooled last hidden state."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from safetensors.numpy import load_file

    cfg = json.loads((model_dir / "config.json").read_text())
    heads, eps = int(cfg["num_attention_heads"]), float(cfg.get("layer_norm_eps", 1e-12))
    w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    hidden = w["embeddings.word_embeddings.weight"].shape[1]
    inits, nodes = [], []

    def const(name: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(kind: str, inputs: list[str], **attrs) -> str:
        out_name = f"t{len(nodes)}"
        nodes.append(helper.make_node(kind, inputs, [out_name], **attrs))
        return out_name

    def linear(x: str, p: str) -> str:
        return op("Add", [op("MatMul", [x, const(p + ".wT", w[p + ".weight"].T.copy())]), const(p + ".b", w[p + ".bias"])])

    def layer_norm(x: str, p: str) -> str:
        return op("LayerNormalization", [x, const(p + ".w", w[p + ".weight"]), const(p + ".b", w[p + ".bias"])],
                  axis=-1, epsilon=eps)

    const("split_heads", np.array([0, 0, heads, hidden // heads], np.int64))
    const("merge_heads", np.array([0, 0, hidden], np.int64))
    const("scale", np.array(1.0 / np.sqrt(hidden // heads), np.float32))
    const("one", np.array(1.0, np.float32))
    const("masked", np.array(-1e4, np.float32))
    const("axis1", np.array([1], np.int64))
    seq_len = op("Squeeze", [op("Shape", ["input_ids"], start=1, end=2)])
    positions = op("Range", [const("start", np.array(0, np.int64)), seq_len, const("step", np.array(1, np.int64))])
    x = op("Add", [op("Gather", [const("word", w["embeddings.word_embeddings.weight"]), "input_ids"]),
                   op("Gather", [const("pos", w["embeddings.position_embeddings.weight"]), positions])])
    x = layer_norm(op("Add", [x, const("type0", w["embeddings.token_type_embeddings.weight"][0])]), "embeddings.LayerNorm")
    mask = op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    bias = op("Mul", [op("Sub", ["one", op("Unsqueeze", [mask, const("axes12", np.array([1, 2], np.int64))])]), "masked"])
    for i in range(int(cfg["num_hidden_layers"])):
        p = f"encoder.layer.{i}."
        q, k, v = (op("Reshape", [linear(x, p + f"attention.self.{n}"), "split_heads"]) for n in ("query", "key", "value"))
        scores = op("MatMul", [op("Transpose", [q], perm=[0, 2, 1, 3]), op("Transpose", [k], perm=[0, 2, 3, 1])])
        probs = op("Softmax", [op("Add", [op("Mul", [scores, "scale"]), bias])], axis=-1)
        ctx = op("Transpose", [op("MatMul", [probs, op("Transpose", [v], perm=[0, 2, 1, 3])])], perm=[0, 2, 1, 3])
        x = layer_norm(op("Add", [linear(op("Reshape", [ctx, "merge_heads"]), p + "attention.output.dense"), x]),
                       p + "attention.output.LayerNorm")
        inner = op("Gelu", [linear(x, p + "intermediate.dense")])
        x = layer_norm(op("Add", [linear(inner, p + "output.dense"), x]), p + "output.LayerNorm")
    summed = op("ReduceSum", [op("Mul", [x, op("Unsqueeze", [mask, const("axis2", np.array([2], np.int64))])]), "axis1"],
                keepdims=0)
    nodes.append(helper.make_node("Div", [summed, op("Max", [op("ReduceSum", [mask, "axis1"], keepdims=1), "one"])],
                                  ["pooled"]))
    graph = helper.make_graph(nodes, "bert", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["b", "n"]),
                                              helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["b", "n"])],
                              [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["b", hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    onnx.save(model, str(out))


def quantize(graph: Path, out: Path) -> None:
    """`graph` with its MatMul weights in int8, one scale per output channel (ONNX Runtime dynamic quantization:
    activations are quantized per batch at run time)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # it advises pre-processing (a root-logger warning with a link) on every build; pre-processing would change
    # the vectors the retrieval figures were measured with, so the advice shows only with --verbose
    with without_records_from("onnxruntime/quantization/", environment().verbose):
        quantize_dynamic(str(graph), str(out), per_channel=True, weight_type=QuantType.QInt8)


class BertEncoder:
    """Tokenizer and ONNX Runtime inference for a sentence-transformers BERT folder; `graph` is its built ONNX file.

    Each text runs alone (no padding, and int8 activations are scaled per text, so a text's vector never
    depends on the texts embedded with it), on one thread per core: ONNX Runtime releases the GIL."""

    def __init__(self, model_dir: Path, graph: Path, max_tokens: int = 256):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        cfg = json.loads((model_dir / "config.json").read_text())
        self.dim = int(cfg["hidden_size"])
        self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(min(max_tokens, int(cfg["max_position_embeddings"])))
        self.threads = environment().compute_threads()
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        self._session = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])

    def token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts))]

    def _one(self, ids: Sequence[int]) -> np.ndarray:
        arr = np.asarray([ids or [0]], dtype=np.int64)
        mask = np.ones_like(arr) if ids else np.zeros_like(arr)
        return self._session.run(None, {"input_ids": arr, "attention_mask": mask})[0][0]

    def mean_pooled(self, ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Mean of the last hidden state over the tokens, one row per sequence."""
        out = np.zeros((len(ids), self.dim), dtype=np.float32)
        if self.threads < 2 or len(ids) < 2:
            for i, s in enumerate(ids):
                out[i] = self._one(s)
            return out
        from concurrent.futures import ThreadPoolExecutor

        order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first: the threads finish together
        with ThreadPoolExecutor(self.threads) as pool:
            for i, row in zip(order, pool.map(lambda i: self._one(ids[i]), order)):
                out[i] = row
        return out
