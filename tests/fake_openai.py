"""A real OpenAI-compatible HTTP server on loopback, scripted per test (no network, no API key)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class FakeOpenAI:
    """`reply(prompt) -> str` decides each chat completion; requests are recorded."""

    def __init__(self, reply: Callable[[str], str]):
        self.reply = reply
        self.prompts: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path.endswith("/embeddings"):
                    data = [{"object": "embedding", "index": i, "embedding": [float(len(t) % 7), 1.0, float(i)]}
                            for i, t in enumerate(body["input"])]
                    payload = {"object": "list", "data": data, "model": body["model"],
                               "usage": {"prompt_tokens": 1, "total_tokens": 1}}
                else:
                    prompt = body["messages"][-1]["content"]
                    outer.prompts.append(prompt)
                    payload = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": outer.reply(prompt)}}],
                               "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}
                raw = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> "FakeOpenAI":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
