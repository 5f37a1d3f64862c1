"""Community summaries (extractive offline: hub entities and their descriptions) and the LLM's
description map-reduce for entities and relations."""

from __future__ import annotations

import json
from dataclasses import dataclass

from lazyhippo.models.tokens import count_tokens, encoding
from lazyhippo.sources.files import sha
from lazyhippo.stores.cache import JsonCache


@dataclass(frozen=True)
class CommunitySummary:
    community_id: str
    title: str
    summary: str
    hub_entities: list[str]


def _sentences(description: str) -> list[str]:
    return [s.strip() for s in (description or "").split(" | ") if s.strip()]


MAX_HUBS = 5  # hub entities a community's extractive summary names


def summarize_extractive(community_id: str, members: list[dict], max_hubs: int = MAX_HUBS,
                         max_chars: int = 900) -> CommunitySummary:
    """members: dicts with name, description, score (hub strength). Hubs first, their descriptions after."""
    hubs = sorted(members, key=lambda m: (-m["score"], m["name"]))[:max_hubs]
    seen: set[str] = set()
    parts: list[str] = []
    for m in hubs:
        for sent in _sentences(m["description"]):
            if sent not in seen and sum(len(p) for p in parts) + len(sent) <= max_chars:
                seen.add(sent)
                parts.append(sent)
    title = " / ".join(m["name"] for m in hubs[:3])
    summary = " ".join(parts) or f"Entities: {', '.join(m['name'] for m in hubs)}."
    return CommunitySummary(community_id, title, summary, [m["name"] for m in hubs])


DESCRIPTION_PROMPT = (
    "Merge these descriptions of {kind} \"{name}\" into one concise description (at most {words} words) that "
    "keeps every distinct fact and resolves contradictions. Reply with the description only.\n\n{items}")
DESCRIPTION_VERSION = "desc-" + sha(DESCRIPTION_PROMPT, 8)


@dataclass(frozen=True)
class DescriptionParams:
    join_tokens: int = 200        # at or under this many tokens (all descriptions together) they are joined
    join_count: int = 3           # ... or when there are at most this many
    batch_tokens: int = 1200      # one summarization call reads at most this many tokens of descriptions
    max_depth: int = 3            # reduce rounds; past it the joined text is cut to join_tokens
    words: int = 80


def summarize_descriptions(llm, kind: str, name: str, descriptions: list[str], cache: JsonCache,
                           p: DescriptionParams = DescriptionParams()) -> str:
    """Map-reduce over one entity's (or relation's) descriptions: joined when short, else summarized in
    batches that fit `batch_tokens`, the summaries summarized again, at most `max_depth` rounds. Every call
    is cached by (model, prompt version, name, inputs), so a re-run calls nothing."""
    items = list(dict.fromkeys(d.strip() for d in descriptions if d and d.strip()))
    for depth in range(p.max_depth + 1):
        joined = " | ".join(items)
        if len(items) <= 1 or (count_tokens(joined) <= p.join_tokens and len(items) <= p.join_count):
            return joined
        if depth == p.max_depth:
            break
        items = [_summarize_batch(llm, kind, name, batch, cache, p) for batch in _batches(items, p.batch_tokens)]
    ids = encoding().encode_ordinary(" | ".join(items))
    return encoding().decode(ids[:p.join_tokens])


def _batches(items: list[str], limit: int) -> list[list[str]]:
    out: list[list[str]] = [[]]
    used = 0
    for it in items:
        n = count_tokens(it)
        if out[-1] and used + n > limit:
            out.append([])
            used = 0
        out[-1].append(it)
        used += n
    return out


def _summarize_batch(llm, kind: str, name: str, batch: list[str], cache: JsonCache, p: DescriptionParams) -> str:
    if len(batch) == 1:
        return batch[0]
    key = sha(f"{llm.model}|{DESCRIPTION_VERSION}|{kind}|{name}|{json.dumps(batch)}", 40)
    hit = cache.get(key)
    if hit is not None:
        return str(hit)
    prompt = DESCRIPTION_PROMPT.format(kind=kind, name=name, words=p.words,
                                       items="\n".join(f"- {d}" for d in batch))
    text = llm.complete(prompt, max_tokens=p.words * 3, operation="summarization").text.strip()
    text = text or " | ".join(batch)
    cache.put(key, text)
    return text
