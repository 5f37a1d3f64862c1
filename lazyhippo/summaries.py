"""Community summaries: extractive offline (hub entities and their descriptions); LLM when configured."""

from __future__ import annotations

from dataclasses import dataclass

from .llm import LLM


@dataclass(frozen=True)
class CommunitySummary:
    community_id: str
    title: str
    summary: str
    hub_entities: list[str]


def _sentences(description: str) -> list[str]:
    return [s.strip() for s in (description or "").split(" | ") if s.strip()]


def summarize_extractive(community_id: str, members: list[dict], max_hubs: int = 5,
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


def summarize_llm(llm: LLM, base: CommunitySummary) -> tuple[CommunitySummary, object]:
    prompt = (f"Write a short title (one line) and a 3-sentence summary of this group of related entities.\n"
              f"Entities: {', '.join(base.hub_entities)}\nEvidence: {base.summary}\n"
              f"Answer as: TITLE: ...\\nSUMMARY: ...")
    comp = llm.complete(prompt)
    title, summary = base.title, base.summary
    for line in comp.text.splitlines():
        if line.upper().startswith("TITLE:"):
            title = line.split(":", 1)[1].strip() or title
        elif line.upper().startswith("SUMMARY:"):
            summary = line.split(":", 1)[1].strip() or summary
    return CommunitySummary(base.community_id, title, summary, base.hub_entities), comp
