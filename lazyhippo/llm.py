"""LLM protocol: an OpenAI-compatible chat endpoint when configured, else nothing (offline paths are used)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Completion:
    text: str
    model: str
    prompt_tokens: int
    completion_tokens: int


class LLM(Protocol):
    model: str

    def complete(self, prompt: str, *, json_mode: bool = False) -> Completion: ...


class OpenAIChat:
    """Talks to any OpenAI-compatible endpoint; key and base URL come from the environment only."""

    def __init__(self, model: str, base_url: str | None = None, api_key: str | None = None,
                 timeout: float = 60.0):
        from openai import OpenAI

        self.model = model
        self._client = OpenAI(base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
                              api_key=api_key or os.environ.get("OPENAI_API_KEY") or "unset",
                              timeout=timeout, max_retries=2)

    def complete(self, prompt: str, *, json_mode: bool = False) -> Completion:
        kwargs = {"response_format": {"type": "json_object"}} if json_mode else {}
        resp = self._client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}], temperature=0, **kwargs)
        usage = resp.usage
        return Completion(resp.choices[0].message.content or "", resp.model or self.model,
                          getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0)


def configured_llm(settings) -> LLM | None:
    """The LLM `settings.llm` names (`Settings.from_env` picks "openai" when an endpoint is configured);
    None keeps every path offline."""
    return OpenAIChat(settings.llm_model) if settings.llm == "openai" else None
