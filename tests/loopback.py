"""Real HTTP servers on loopback, scripted per test (no network, no API key)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

Route = Callable[[str, dict], tuple[int, dict]]  # (path, JSON body) -> (status, JSON payload)


class LoopbackJSONServer:
    def __init__(self, route: Route):
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep test output clean
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                status, payload = route(self.path, body)
                raw = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class FakeOpenAI(LoopbackJSONServer):
    """An OpenAI-compatible endpoint: `reply(prompt) -> str` decides each chat completion."""

    def __init__(self, reply: Callable[[str], str]):
        self.prompts: list[str] = []
        super().__init__(self._route)
        self.reply = reply

    @property
    def base_url(self) -> str:
        return self.root + "/v1"

    def _route(self, path: str, body: dict) -> tuple[int, dict]:
        if path.endswith("/embeddings"):
            data = [{"object": "embedding", "index": i, "embedding": [float(len(t) % 7), 1.0, float(i)]}
                    for i, t in enumerate(body["input"])]
            return 200, {"object": "list", "data": data, "model": body["model"],
                         "usage": {"prompt_tokens": 1, "total_tokens": 1}}
        prompt = body["messages"][-1]["content"]
        self.prompts.append(prompt)
        return 200, {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": self.reply(prompt)}}],
                     "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


class OpenAIProxy:
    """A loopback proxy in front of a real OpenAI-compatible server, to stage its failures without touching
    it: at the first chat request whose prompt `stop_when` picks it drops the connection and stops listening
    (as a stopped server does), and `corrupt(prompt)` picks replies whose content it replaces with broken JSON."""

    def __init__(self, upstream: str, stop_when: Callable[[str], bool] | None = None,
                 corrupt: Callable[[str], bool] | None = None):
        import urllib.request

        self.upstream = upstream.rstrip("/")
        self.prompts: list[str] = []
        self.requests: list[dict] = []  # every chat request passed on, as sent
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _forward(self, body: bytes | None):
                req = urllib.request.Request(outer.upstream.rsplit("/v1", 1)[0] + self.path, data=body, method=self.command,
                                             headers={"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=300) as resp:
                    return resp.status, resp.read()

            def _send(self, status: int, raw: bytes):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send(*self._forward(None))

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if not self.path.endswith("/chat/completions"):
                    return self._send(*self._forward(body))
                prompt = json.loads(body)["messages"][-1]["content"]
                if outer.stop_when is not None and outer.stop_when(prompt):
                    self.close_connection = True
                    threading.Thread(target=outer.stop, daemon=True).start()
                    return
                outer.prompts.append(prompt)
                outer.requests.append(json.loads(body))
                status, raw = self._forward(body)
                if outer.corrupt is not None and outer.corrupt(prompt):
                    payload = json.loads(raw)
                    payload["choices"][0]["message"]["content"] = '{"entities": [{"name": '
                    raw = json.dumps(payload).encode()
                self._send(status, raw)

        self.stop_when = stop_when
        self.corrupt = corrupt
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._stopped = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.server.shutdown()
            self.server.server_close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
