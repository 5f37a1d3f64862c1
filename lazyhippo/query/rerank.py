"""Optional reranker stage: a cross-encoder or an HTTP rerank API, behind a timeout, a minimum score and a
circuit breaker. Whenever the reranker fails (error, timeout, bad response) or the breaker is open, the
retrieval order is kept: reranking can improve an answer but never take one away.

Breaker: closed -> open after `failure_threshold` consecutive failures -> half-open after `cooldown`
seconds (one trial call) -> closed on success, open again on failure.

Defaults are the design's safety values: the 20 best chunks reranked, scores under 0.1 dropped, 2 s before
falling back, the breaker opening after 5 consecutive failures and half-opening after 60 s. `configured_reranker`
builds the stage the settings name (`LAZYHIPPO_RERANK`, `LAZYHIPPO_RERANK_URL`, ...), once per process.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Callable, Protocol, Sequence

from lazyhippo.query.types import ScoredChunk
from lazyhippo.settings import Environment, Settings, environment

TIMEOUT = 2.0
MIN_SCORE = 0.1


class Reranker(Protocol):
    name: str

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        """One relevance score per text (higher is better)."""
        ...


class RerankError(RuntimeError):
    pass


class RerankUnavailable(ValueError):
    """The settings name a reranker this process cannot build (no endpoint, no model, no extra)."""


class HttpReranker:
    """Any rerank endpoint speaking the common JSON shape: POST {model, query, documents[, top_n]} ->
    {"results": [{"index", "relevance_score"}]} (Cohere, Jina, Voyage, vLLM, LiteLLM) or a bare list of
    {"index", "score"} (Hugging Face TEI). Timeout applies to the socket; no retries (the breaker decides)."""

    def __init__(self, url: str, model: str | None = None, api_key: str | None = None, timeout: float = TIMEOUT,
                 name: str | None = None):
        self.url = url
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.name = name or f"http:{model or url}"

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        import urllib.error  # here: urllib.request loads ssl, which a query without a reranker never needs
        import urllib.request

        body = {"query": query, "documents": list(texts), "top_n": len(texts)}
        if self.model:
            body["model"] = self.model
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(self.url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read().decode() or "null")
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
            raise RerankError(f"rerank request failed: {exc}") from exc
        rows = data.get("results", data.get("data")) if isinstance(data, dict) else data
        if not isinstance(rows, list):
            raise RerankError(f"unexpected rerank response: {str(data)[:200]}")
        scores = [float("-inf")] * len(texts)
        try:
            for row in rows:
                i = int(row["index"])
                scores[i] = float(row.get("relevance_score", row.get("score")))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise RerankError(f"malformed rerank row: {exc}") from exc
        if any(s == float("-inf") for s in scores):
            raise RerankError("rerank response did not score every document")
        return scores


class CrossEncoderReranker:
    """A sentence-transformers CrossEncoder from a local path (no download at run time). Optional: needs the
    `rerank` extra (`pip install -e ".[rerank]"`), which brings torch; the default install leaves it out."""

    def __init__(self, model_path: str, batch_size: int = 32, max_length: int = 512, device: str = "cpu"):
        try:
            from sentence_transformers import CrossEncoder
        except ImportError as exc:
            raise RuntimeError('the cross-encoder reranker needs the optional extra: pip install -e ".[rerank]"') from exc

        self.name = f"cross-encoder:{model_path}"
        self._model = CrossEncoder(model_path, max_length=max_length, device=device, local_files_only=True)
        self.batch_size = batch_size

    def score(self, query: str, texts: Sequence[str]) -> list[float]:
        return [float(s) for s in self._model.predict([(query, t) for t in texts], batch_size=self.batch_size,
                                                      show_progress_bar=False)]


class CircuitBreaker:
    CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"

    def __init__(self, failure_threshold: int = 5, cooldown: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.failure_threshold = failure_threshold
        self.cooldown = cooldown
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._lock = threading.Lock()

    @property
    def state(self) -> str:
        if self.opened_at is None:
            return self.CLOSED
        return self.HALF_OPEN if self.clock() - self.opened_at >= self.cooldown else self.OPEN

    def allow(self) -> bool:
        return self.state != self.OPEN

    def record_success(self) -> None:
        with self._lock:
            self.failures = 0
            self.opened_at = None

    def record_failure(self) -> None:
        with self._lock:
            if self.opened_at is not None:  # the half-open trial failed: open again for a full cool-down
                self.opened_at = self.clock()
                return
            self.failures += 1
            if self.failures >= self.failure_threshold:
                self.opened_at = self.clock()


_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lazyhippo-rerank")


class RerankStage:
    """Reorders the best `top_n` chunks by reranker score; keeps retrieval scores in `channels['retrieval']`.
    Its diagnostics' `status`: ran, skipped (breaker open), timeout, failed, below_min_score (every score under
    `min_score`: retrieval order kept) or empty."""

    def __init__(self, reranker: Reranker, breaker: CircuitBreaker | None = None, timeout: float = TIMEOUT,
                 min_score: float | None = MIN_SCORE, top_n: int = 20):
        self.reranker = reranker
        self.breaker = breaker or CircuitBreaker()
        self.timeout = timeout
        self.min_score = min_score
        self.top_n = top_n

    def apply(self, query: str, chunks: list[ScoredChunk]) -> tuple[list[ScoredChunk], dict]:
        info = {"reranker": getattr(self.reranker, "name", type(self.reranker).__name__), "top_n": self.top_n}
        if not chunks:
            return chunks, {**info, "status": "empty", "breaker": self.breaker.state}
        if not self.breaker.allow():
            return chunks, {**info, "status": "skipped", "detail": "circuit breaker open", "breaker": self.breaker.state}
        head, tail = chunks[:self.top_n], chunks[self.top_n:]
        t0 = time.perf_counter()
        try:
            fut = _POOL.submit(self.reranker.score, query, [f"{c.title}\n{c.text}" for c in head])
            scores = fut.result(timeout=self.timeout)
            if len(scores) != len(head):
                raise RerankError(f"reranker returned {len(scores)} scores for {len(head)} chunks")
        except FutureTimeout:
            self.breaker.record_failure()
            return chunks, {**info, "status": "timeout", "detail": f"no answer within {self.timeout:g} s",
                            "breaker": self.breaker.state}
        except Exception as exc:  # noqa: BLE001 - any reranker failure falls back to the retrieval order
            self.breaker.record_failure()
            return chunks, {**info, "status": "failed", "detail": f"{type(exc).__name__}: {exc}"[:300],
                            "breaker": self.breaker.state}
        self.breaker.record_success()
        out = []
        for c, s in zip(head, scores):
            out.append(replace(c, score=float(s), channels={**c.channels, "retrieval": c.score, "rerank": float(s)}))
        out.sort(key=lambda c: (-c.score, c.chunk_id))
        dropped = 0
        if self.min_score is not None:
            kept = [c for c in out if c.score >= self.min_score]
            dropped = len(out) - len(kept)
            if not kept:
                return chunks, {**info, "status": "below_min_score", "breaker": self.breaker.state}
            out = kept
        # chunks beyond top_n keep their order below the reranked head
        floor = min(c.score for c in out)
        for i, c in enumerate(tail):
            out.append(replace(c, score=floor - 1e-6 * (i + 1), channels={**c.channels, "retrieval": c.score}))
        return out, {**info, "status": "ran", "dropped_below_min": dropped, "breaker": self.breaker.state,
                     "ms": round((time.perf_counter() - t0) * 1000, 2)}


_STAGES: dict[tuple, RerankStage] = {}
_STAGES_LOCK = threading.Lock()


def configured_reranker(settings: Settings, env: Environment | None = None) -> RerankStage | None:
    """The stage `settings.rerank` names (None for `none`), one per process and configuration: its breaker
    counts the failures of every query, not just one. Endpoint, model and key come from `environment()`."""
    if settings.rerank == "none":
        return None
    env = env or environment()
    key = (settings.rerank, settings.rerank_top_n, env.rerank_url, env.rerank_model, env.rerank_api_key)
    with _STAGES_LOCK:
        stage = _STAGES.get(key)
        if stage is None:
            stage = _STAGES[key] = RerankStage(_reranker(settings.rerank, env), top_n=settings.rerank_top_n)
    return stage


def _reranker(provider: str, env: Environment) -> Reranker:
    if provider == "http":
        if not env.rerank_url:
            raise RerankUnavailable("rerank 'http' needs the endpoint: set LAZYHIPPO_RERANK_URL (and LAZYHIPPO_RERANK_MODEL, "
                             "LAZYHIPPO_RERANK_API_KEY if the service wants them)")
        # the socket outlives the stage's timeout: a slow service reads as a timeout, not as a socket error
        return HttpReranker(env.rerank_url, env.rerank_model, env.rerank_api_key, timeout=TIMEOUT + 1.0)
    if not env.rerank_model:
        raise RerankUnavailable("rerank 'cross-encoder' needs a local model folder: set LAZYHIPPO_RERANK_MODEL")
    try:
        return CrossEncoderReranker(env.rerank_model)
    except (RuntimeError, OSError) as exc:  # the extra is not installed, or no model in that folder
        raise RerankUnavailable(f"rerank 'cross-encoder' with LAZYHIPPO_RERANK_MODEL={env.rerank_model!r}: {exc}") from exc
