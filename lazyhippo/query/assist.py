"""LLM-assisted local retrieval, opt-in: the two steps HippoRAG 2 and IRCoT give an LLM.

Recognition memory: the LLM reads the facts that best match the question and keeps the relevant ones
before their entities seed PPR. Iterative multi-hop: after a retrieval the LLM reads the best passages and
names what is still missing (the bridge), or says the question is covered; the next retrieval asks for
the question plus that, at most `rounds` retrievals in all, and the rounds' rankings are fused.

Never on the offline path: only a caller that passes a `RetrievalAssist` gets it. Every call has a
timeout; a failed or timed-out call, or an open circuit breaker, falls back to the offline ranking for
that step. Token usage is counted on the client's meter and reported per question.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Sequence

from lazyhippo.models.llm import LLM, parse_json
from lazyhippo.query.rerank import CircuitBreaker

_POOL = ThreadPoolExecutor(max_workers=4, thread_name_prefix="lazyhippo-assist")

FILTER_PROMPT = """Question: {question}

Candidate facts:
{facts}

Which facts help answer the question (directly, or as a step towards the answer)? Reply with JSON only:
{{"keep": [numbers of the useful facts]}}"""

NEXT_PROMPT = """Question: {question}

Passages retrieved so far:
{passages}

If these passages hold everything needed to answer the question, reply {{"done": true}}. Otherwise name the
missing piece to search for next (the person, work or place the passages point to, and what about it), in a
few words. Reply with JSON only: {{"done": false, "search": "..."}}"""

_FILTER_SCHEMA = {"type": "object", "required": ["keep"],
                  "properties": {"keep": {"type": "array", "maxItems": 20, "items": {"type": "integer"}}}}
_NEXT_SCHEMA = {"type": "object", "required": ["done"],
                "properties": {"done": {"type": "boolean"}, "search": {"type": "string", "maxLength": 120}}}


class RetrievalAssist:
    """The LLM steps of local retrieval, each with a timeout and behind one circuit breaker."""

    def __init__(self, llm: LLM, timeout: float = 10.0, rounds: int = 3, breaker: CircuitBreaker | None = None,
                 max_tokens: int = 120):
        if not 1 <= rounds <= 3:
            raise ValueError(f"rounds must be 1, 2 or 3 (got {rounds})")
        self.llm = llm
        self.timeout = timeout
        self.rounds = rounds
        self.breaker = breaker or CircuitBreaker()
        self.max_tokens = max_tokens
        self.events: list[str] = []       # what happened to each step of the current question

    def _ask(self, operation: str, prompt: str, schema: dict) -> dict | None:
        """The model's JSON object, or None (breaker open, timeout, error, malformed): the caller falls back."""
        if not self.breaker.allow():
            self.events.append(f"{operation}: skipped (breaker open)")
            return None
        fut = _POOL.submit(self.llm.complete, prompt, json_schema=schema, max_tokens=self.max_tokens,
                           operation=operation)
        try:
            data = parse_json(fut.result(timeout=self.timeout).text)
        except FutureTimeout:
            self.breaker.record_failure()
            self.events.append(f"{operation}: fallback (timeout after {self.timeout}s)")
            return None
        except Exception as exc:  # noqa: BLE001 - any failure falls back to the offline ranking
            self.breaker.record_failure()
            self.events.append(f"{operation}: fallback ({type(exc).__name__}: {exc})"[:200])
            return None
        self.breaker.record_success()
        self.events.append(f"{operation}: ok")
        return data

    def filter_facts(self, question: str, facts: Sequence[str]) -> list[int] | None:
        """Positions of the facts the LLM keeps (in the given order), or None to keep the offline choice."""
        if not facts:
            return []
        listed = "\n".join(f"{i + 1}. {f}" for i, f in enumerate(facts))
        data = self._ask("recognition", FILTER_PROMPT.format(question=question, facts=listed), _FILTER_SCHEMA)
        if data is None or not isinstance(data.get("keep"), list):
            return None
        keep = {int(i) - 1 for i in data["keep"] if isinstance(i, (int, float)) or str(i).isdigit()}
        return [i for i in range(len(facts)) if i in keep]

    def next_search(self, question: str, passages: Sequence[str]) -> str | None:
        """What to retrieve next, or None when the passages cover the question (or the step failed)."""
        listed = "\n".join(f"[{i + 1}] {p[:600]}" for i, p in enumerate(passages))
        data = self._ask("bridge", NEXT_PROMPT.format(question=question, passages=listed), _NEXT_SCHEMA)
        if data is None or data.get("done") is True:
            return None
        search = re.sub(r"\s+", " ", str(data.get("search") or "")).strip()
        return search or None


def fuse_rounds(rankings: Sequence[Sequence[str]], k: int = 5) -> list[str]:
    """Reciprocal-rank fusion of the rounds' rankings (ids, best first); ties keep the earlier round's order."""
    score: dict[str, float] = {}
    for ranking in rankings:
        for r, key in enumerate(ranking):
            score[key] = score.get(key, 0.0) + 1.0 / (k + r + 1)
    return sorted(score, key=lambda key: -score[key])


def iterate(question: str, search: Callable[[str], list], key: Callable[[object], str],
            text: Callable[[object], str], assist: RetrievalAssist, shown: int = 5) -> tuple[list, list[str]]:
    """IRCoT's loop without a reader: retrieve, ask for the missing piece, retrieve the question plus it,
    at most `assist.rounds` retrievals; returns the fused results and the searches made after the first."""
    first = search(question)
    rounds, searches, seen = [first], [], {key(x): x for x in first}
    for _ in range(assist.rounds - 1):
        best = fuse_rounds([[key(x) for x in r] for r in rounds])[:shown]
        step = assist.next_search(question, [text(seen[b]) for b in best])
        if step is None or step in searches:
            break
        searches.append(step)
        found = search(f"{question} {step}")
        rounds.append(found)
        seen.update({key(x): x for x in found if key(x) not in seen})
    order = fuse_rounds([[key(x) for x in r] for r in rounds]) if len(rounds) > 1 else [key(x) for x in first]
    return [seen[k] for k in order], searches


def assisted_local(idx, prepare: Callable[[str], object], question: str, p, top_k: int, ppr,
                   assist: RetrievalAssist) -> tuple[list, dict]:
    """The local route with both LLM steps: every retrieval's facts go through recognition memory, and the
    rounds of `iterate` are fused; chunks carry descending scores in the fused order. Diagnostics name
    each step's outcome, the searches and the tokens used."""
    from dataclasses import replace

    from lazyhippo.query.local import retrieve_local

    assist.events = []
    meter = getattr(assist.llm, "meter", None)
    before = meter.snapshot() if meter else {}
    diags: list[dict] = []

    def search(text: str) -> list:
        filt = lambda facts: assist.filter_facts(question, facts)  # noqa: E731 - judged against the question
        chunks, diag = retrieve_local(idx, prepare(text), p, top_k, ppr, fact_filter=filt)
        diags.append(diag)
        return chunks

    chunks, searches = iterate(question, search, lambda c: c.chunk_id, lambda c: f"{c.title}: {c.text}", assist)
    chunks = [replace(c, score=float(len(chunks) - i)) for i, c in enumerate(chunks[:top_k])]
    usage = meter.since(before) if meter else []
    return chunks, {**diags[0], "assist": {"rounds": len(diags), "searches": searches, "steps": list(assist.events),
                                           "breaker": assist.breaker.state, "usage": usage}}
