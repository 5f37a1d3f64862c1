"""llama.cpp's OpenAI-compatible HTTP server (from the xllamacpp wheel) on loopback, for scripts/services.sh.

Runs inside the services venv (.services/llm/venv), never the project's. The server lives in this process
(xllamacpp embeds llama.cpp's C++ server); SIGTERM/SIGINT stop it. Everything comes from the environment
that services.sh sets: model path, port, alias, context, slots, threads and chat template. Nothing is downloaded.
"""

from __future__ import annotations

import os
import signal
import sys
import threading


def main() -> int:
    import xllamacpp as xlc

    env = os.environ
    params = xlc.CommonParams()
    params.model.path = env["LAZYHIPPO_LLM_MODEL_PATH"]
    params.hostnames = ["127.0.0.1"]  # loopback only
    params.port = int(env["LAZYHIPPO_LLM_PORT"])
    params.model_alias = {env["LAZYHIPPO_LLM_ALIAS"]}
    params.n_ctx = int(env["LAZYHIPPO_LLM_CTX"])          # shared by the slots
    params.n_parallel = int(env["LAZYHIPPO_LLM_PARALLEL"])
    # One compute thread: on a busy 2-core machine OpenMP threads spin waiting for each other (measured
    # 1.5 tokens/s with 2 threads vs 12.7 with 1 under load).
    threads = int(env["LAZYHIPPO_LLM_THREADS"])
    params.cpuparams.n_threads = threads
    params.cpuparams_batch.n_threads = threads
    # The GGUF carries no chat template, and llama.cpp's fallback (ChatML) makes Gemma emit "<|im_end|>" as
    # text until max_tokens: use Gemma's turn format (system folded into the first user turn).
    params.chat_template = open(env["LAZYHIPPO_LLM_CHAT_TEMPLATE"], encoding="utf-8").read()
    params.ui = False
    params.offline = True
    params.cache_ram_mib = 256
    server = xlc.Server(params)
    print(f"lazyhippo-llm: listening on {server.listening_address}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
