"""The models the stages and queries call: embedders (offline MiniLM via ONNX Runtime), the LLM client, extractors, tokens."""
