"""The LLM client: any OpenAI-compatible chat endpoint (OpenAI, Azure, vLLM, llama.cpp, Ollama) through the
`openai` SDK. Base URL, model and key come from the environment (or the caller), never from code.

Why a wrapper at all: every call site needs the same things and must not re-invent them - a per-call
timeout, retries with exponential backoff on 429 / 5xx / timeouts / refused connections, a bound on
concurrent requests, structured output where the server supports it (JSON schema, else JSON mode, else
plain text read by a tolerant parser), a clear error for a model the server does not serve, and token
usage counted per operation (extraction, summarization, reports, answers).
"""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, Sequence, TypeVar

from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential_jitter

from lazyhippo.settings import environment

T = TypeVar("T")
R = TypeVar("R")
Messages = list[dict]


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int
    truncated: bool = False  # the server stopped at max_tokens


class LLMError(RuntimeError):
    """A call that cannot succeed by retrying: wrong model, bad key, request rejected. The run stops."""


class LLMUnavailable(LLMError):
    """The endpoint did not answer after every retry (down, overloaded, timing out). The run stops;
    whatever was cached before stays cached."""


class LLM(Protocol):
    model: str

    def complete(self, prompt: str | Messages, *, json_schema: dict | None = None, json_mode: bool = False,
                 max_tokens: int | None = None, operation: str = "other") -> Completion: ...


class UsageMeter:
    """Input/output tokens and calls per (operation, model); thread-safe, shared by one client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[tuple[str, str], list[int]] = {}

    def add(self, operation: str, model: str, prompt_tokens: int, completion_tokens: int) -> None:
        with self._lock:
            row = self._rows.setdefault((operation, model), [0, 0, 0])
            row[0] += 1
            row[1] += prompt_tokens
            row[2] += completion_tokens

    def snapshot(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        with self._lock:
            return {k: tuple(v) for k, v in self._rows.items()}

    def since(self, before: dict) -> list[dict]:
        """Rows added after `before` (a snapshot): what one stage used."""
        out = []
        for (op, model), (calls, p, c) in sorted(self.snapshot().items()):
            b = before.get((op, model), (0, 0, 0))
            if calls - b[0]:
                out.append({"operation": op, "model": model, "calls": calls - b[0],
                            "prompt_tokens": p - b[1], "completion_tokens": c - b[2]})
        return out


def parse_json(text: str) -> dict:
    """Tolerant JSON reading for servers without structured output: code fences, prose around the
    object, trailing commas. Raises ValueError when no JSON object can be recovered."""
    text = re.sub(r"```(?:json)?", "", text or "").strip()
    start = text.find("{")
    if start < 0:
        raise ValueError("no JSON object in the reply")
    depth, in_str, esc = 0, False, False
    for i in range(start, len(text)):
        ch = text[i]
        if in_str:
            esc, in_str = (not esc and ch == "\\"), in_str and (esc or ch != '"')
            continue
        if ch == '"':
            in_str = True
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                body = re.sub(r",\s*([}\]])", r"\1", text[start:i + 1])
                value = json.loads(body)
                if not isinstance(value, dict):
                    raise ValueError("the reply's JSON is not an object")
                return value
    raise ValueError("unterminated JSON object in the reply")


def _retryable(exc: BaseException) -> bool:
    import openai

    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError)):
        return True
    return isinstance(exc, openai.APIStatusError) and exc.status_code >= 500 and exc.status_code != 501


@dataclass(frozen=True)
class LLMConfig:
    model: str
    base_url: str | None = None
    api_key: str | None = None
    timeout: float = 120.0          # seconds per request
    max_retries: int = 4            # on 429 / 5xx / timeouts / connection errors
    backoff_max: float = 8.0        # seconds, exponential with jitter from 0.5 s
    concurrency: int = 2            # requests in flight at once
    temperature: float = 0.0

    @classmethod
    def from_env(cls, model: str | None = None, **overrides) -> "LLMConfig":
        """OPENAI_BASE_URL, OPENAI_API_KEY and LAZYHIPPO_LLM_MODEL (the argument wins)."""
        env = environment()
        return cls(model=model or env.llm_model or "gpt-4o-mini", base_url=env.openai_base_url,
                   api_key=env.openai_api_key, **overrides)


class OpenAIChat:
    """One client per run: the SDK's own retries are off, ours (with backoff) count every failure kind."""

    def __init__(self, config: LLMConfig | str, meter: UsageMeter | None = None):
        from openai import OpenAI

        self.config = config if isinstance(config, LLMConfig) else LLMConfig.from_env(config)
        self.model = self.config.model
        self.meter = meter or UsageMeter()
        self._client = OpenAI(base_url=self.config.base_url, api_key=self.config.api_key or "unset",
                              timeout=self.config.timeout, max_retries=0)
        self._slots = threading.Semaphore(max(1, self.config.concurrency))
        self._formats = ["json_schema", "json_object"]  # what the server still accepts (learned on 400s)
        self._checked = False
        self._lock = threading.Lock()

    @property
    def base_url(self) -> str:
        return str(self._client.base_url)

    def check(self) -> None:
        """Fail fast, naming the problem, when the endpoint does not serve this model (or cannot be reached)."""
        if self._checked:
            return
        import openai

        try:
            served = [m.id for m in self._call(lambda: self._client.models.list()).data]
        except openai.AuthenticationError as exc:
            raise LLMError(f"the LLM endpoint {self.base_url} rejected the API key (OPENAI_API_KEY): {exc.message}") from None
        except openai.APIStatusError as exc:
            if exc.status_code not in (404, 405, 501):
                raise
            served = None  # no model listing on this server: the first call will tell
        if served is not None and self.model not in served:
            raise LLMError(f"model {self.model!r} is not served by {self.base_url} (it serves: "
                           f"{', '.join(served) or 'nothing'}); set LAZYHIPPO_LLM_MODEL or --llm-model")
        self._checked = True

    def _call(self, fn: Callable[[], R]) -> R:
        @retry(retry=retry_if_exception(_retryable), reraise=True, stop=stop_after_attempt(self.config.max_retries + 1),
               wait=wait_exponential_jitter(multiplier=0.5, max=self.config.backoff_max))
        def attempt() -> R:
            with self._slots:
                return fn()

        try:
            return attempt()
        except Exception as exc:
            if _retryable(exc):
                raise LLMUnavailable(f"LLM endpoint {self.base_url} unavailable after {self.config.max_retries + 1} "
                                     f"attempts: {type(exc).__name__}: {exc}") from exc
            raise

    def _response_format(self, json_schema: dict | None, json_mode: bool) -> dict | None:
        if json_schema is not None and "json_schema" in self._formats:
            return {"type": "json_schema", "json_schema": {"name": "result", "schema": json_schema, "strict": True}}
        if (json_schema is not None or json_mode) and "json_object" in self._formats:
            return {"type": "json_object"}
        return None

    def complete(self, prompt: str | Messages, *, json_schema: dict | None = None, json_mode: bool = False,
                 max_tokens: int | None = None, operation: str = "other", temperature: float | None = None
                 ) -> Completion:
        import openai

        self.check()
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        while True:
            fmt = self._response_format(json_schema, json_mode)
            kwargs = {"response_format": fmt} if fmt else {}
            if max_tokens:
                kwargs["max_tokens"] = max_tokens
            try:
                resp = self._call(lambda: self._client.chat.completions.create(
                    model=self.model, messages=messages,
                    temperature=self.config.temperature if temperature is None else temperature, **kwargs))
                break
            except openai.BadRequestError as exc:
                if fmt and ("response_format" in str(exc) or "json" in str(exc).lower()):
                    with self._lock:  # the server does not do this format: step down, remember it
                        if fmt["type"] in self._formats:
                            self._formats.remove(fmt["type"])
                    continue
                raise LLMError(f"the LLM endpoint rejected the request ({operation}): {exc.message}") from None
            except openai.NotFoundError as exc:
                raise LLMError(f"model {self.model!r} not found at {self.base_url}: {exc.message}") from None
            except openai.AuthenticationError as exc:
                raise LLMError(f"the LLM endpoint {self.base_url} rejected the API key: {exc.message}") from None
        usage = resp.usage
        p, c = (getattr(usage, "prompt_tokens", 0) or 0), (getattr(usage, "completion_tokens", 0) or 0)
        self.meter.add(operation, self.model, p, c)
        choice = resp.choices[0]
        return Completion(choice.message.content or "", resp.model or self.model, p, c,
                          truncated=choice.finish_reason == "length")

    def complete_json(self, prompt: str | Messages, schema: dict, *, operation: str, max_tokens: int | None = None,
                      attempts: int = 3, validate: Callable[[dict], T] = lambda d: d) -> tuple[T, Completion]:
        """A JSON object matching `schema` (validated by `validate`), retried on malformed output; each retry
        samples warmer, since the same request at temperature 0 would return the same reply."""
        last: Exception | None = None
        for attempt in range(attempts):
            comp = self.complete(prompt, json_schema=schema, max_tokens=max_tokens, operation=operation,
                                 temperature=self.config.temperature + 0.4 * attempt)
            try:
                return validate(parse_json(comp.text)), comp
            except (ValueError, KeyError, TypeError) as exc:
                last = exc
        raise MalformedOutput(f"malformed {operation} JSON after {attempts} attempts: {last}")

    def map(self, fn: Callable[[T], R], items: Sequence[T]) -> list[R | Exception]:
        """fn over items with at most `concurrency` in flight; results in order, exceptions in place. After
        an LLMError (endpoint down, wrong model) the items not yet started get that error without a call."""
        return parallel_map(fn, items, self.config.concurrency, stop_on=LLMError)


class MalformedOutput(ValueError):
    """The model kept answering with JSON that does not parse or validate: recorded per item, not fatal."""


def parallel_map(fn: Callable[[T], R], items: Iterable[T], workers: int,
                 stop_on: type[Exception] | None = None) -> list[R | Exception]:
    fatal: list[Exception] = []

    def safe(item: T) -> R | Exception:
        if fatal:
            return fatal[0]
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - returned in place, the caller decides
            if stop_on is not None and isinstance(exc, stop_on):
                fatal.append(exc)
            return exc

    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [safe(i) for i in items]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(safe, items))


def configured_llm(settings) -> OpenAIChat | None:
    """The LLM `settings.llm` names (`Settings.from_env` picks "openai" when an endpoint is configured):
    a client on OPENAI_BASE_URL / OPENAI_API_KEY with `settings.llm_model`; None keeps every path offline."""
    return OpenAIChat(LLMConfig.from_env(settings.llm_model)) if settings.llm == "openai" else None
