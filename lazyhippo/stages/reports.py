"""The LLM's indexing stages over the warehouse: description map-reduce for entities and relations, and
GraphRAG-style community reports (title, summary, 0-10 rating with its reason, findings citing entities
and chunks, 3 synthetic questions). Both are cached by their inputs, model and prompt version.

Offline neither runs: entity descriptions stay the SQL join and communities keep extractive summaries.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import asdict, dataclass, field

import duckdb
import pyarrow as pa

from lazyhippo.models.llm import LLMError, OpenAIChat
from lazyhippo.settings import Settings
from lazyhippo.sources.files import sha
from lazyhippo.stages.summaries import DescriptionParams, summarize_descriptions
from lazyhippo.stores.cache import JsonCache
from lazyhippo.stores.warehouse import community_members, described, replace_rows


def summarize_graph_descriptions(settings: Settings, con: duckdb.DuckDBPyConnection, llm: OpenAIChat,
                                 p: DescriptionParams = DescriptionParams()) -> dict:
    """Replace the SQL-joined descriptions of entities and relations with the map-reduce over all of
    their extracted descriptions (joined when short, summarized otherwise)."""
    ns = settings.namespace
    ents = con.execute(f"""
        SELECT e.entity_id, e.name, list(DISTINCT x.description ORDER BY x.description)
        FROM entities e JOIN ({described("extracted_entities")}) x ON lh_norm(x.name) = e.norm_name
        WHERE e.namespace = $ns AND coalesce(x.description, '') <> '' GROUP BY e.entity_id, e.name""",
                       {"ns": ns}).fetchall()
    rels = con.execute(f"""
        SELECT r.relation_id, a.name || ' -> ' || b.name, list(DISTINCT x.description ORDER BY x.description)
        FROM relations r
        JOIN entities a ON a.namespace = r.namespace AND a.entity_id = r.source_id
        JOIN entities b ON b.namespace = r.namespace AND b.entity_id = r.target_id
        JOIN ({described("extracted_relations")}) x
             ON least(lh_entity_id(x.source), lh_entity_id(x.target)) = r.source_id
             AND greatest(lh_entity_id(x.source), lh_entity_id(x.target)) = r.target_id
        WHERE r.namespace = $ns AND coalesce(x.description, '') <> ''
        GROUP BY r.relation_id, a.name, b.name""", {"ns": ns}).fetchall()
    cache = JsonCache(settings.cache_dir / "llm.sqlite")
    try:
        def run(kind: str, rows: list) -> dict[str, str]:
            results = llm.map(lambda r: summarize_descriptions(llm, kind, r[1], r[2], cache, p), rows)
            fatal = next((r for r in results if isinstance(r, LLMError)), None)
            if fatal is not None:
                raise fatal
            return {r[0]: res for r, res in zip(rows, results) if isinstance(res, str)}

        new_ents = run("the entity", [r for r in ents if len(r[2]) > 1])
        new_rels = run("the relation", [r for r in rels if len(r[2]) > 1])
    finally:
        cache.close()
    for table, key, values in (("entities", "entity_id", new_ents), ("relations", "relation_id", new_rels)):
        if values:
            con.register("_desc", pa.table({"id": list(values), "description": list(values.values())}))
            con.execute(f"UPDATE {table} SET description = d.description FROM _desc d "
                        f"WHERE {table}.namespace = ? AND {table}.{key} = d.id", [ns])
            con.unregister("_desc")
    return {"entities_summarized": len(new_ents), "relations_summarized": len(new_rels)}


REPORT_PROMPT = """You write a report about one community of related entities in a knowledge graph.

Entities (name: description):
{entities}

Relations:
{relations}

Source passages (cite them by their number):
{chunks}

Reply with one JSON object:
- "title": a short name for the community, naming its key entities
- "summary": 2-3 sentences on what the community is about
- "rating": importance of the community from 0 to 10
- "rating_reason": one sentence explaining the rating
- "findings": 1 to 3 key insights, each with "summary" (one line), "explanation" (1-2 sentences),
  "entities" (names from the list above) and "chunks" (numbers of the passages that support it)
- "questions": exactly 3 questions a reader could answer from this community
"""
REPORT_VERSION = "report-" + sha(REPORT_PROMPT, 8)
def _text(max_length: int) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_length}


def report_schema(entity_names: list[str], n_chunks: int) -> dict:
    """The reply's JSON schema for one community. Bounded everywhere, so a reply always fits max_tokens
    (a small model otherwise repeats itself); a finding's citations are enums of this community's entity
    names and passage numbers, so constrained decoding cannot cite anything that does not exist."""
    entities = {"type": "array", "minItems": 1, "maxItems": 4, "items": {"enum": entity_names}} if entity_names else \
        {"type": "array", "maxItems": 0}
    chunks = {"type": "array", "maxItems": 3, "items": {"enum": list(range(1, n_chunks + 1))}} if n_chunks else \
        {"type": "array", "maxItems": 0}
    return {
        "type": "object", "required": ["title", "summary", "rating", "rating_reason", "findings", "questions"],
        "properties": {
            "title": _text(80), "summary": _text(400), "rating": {"type": "number"}, "rating_reason": _text(160),
            "findings": {"type": "array", "minItems": 1, "maxItems": 3, "items": {
                "type": "object", "required": ["summary", "explanation", "entities", "chunks"],
                "properties": {"summary": _text(120), "explanation": _text(240),
                               "entities": entities, "chunks": chunks}}},
            "questions": {"type": "array", "minItems": 3, "maxItems": 3, "items": _text(120)},
        },
    }


@dataclass
class CommunityReport:
    community_id: str
    title: str
    summary: str
    rating: float
    rating_reason: str
    findings: list[dict] = field(default_factory=list)  # summary, explanation, entities [names], chunk_ids
    questions: list[str] = field(default_factory=list)
    model: str = ""

    def text(self) -> str:
        """What is embedded for the global route: the report and its questions."""
        lines = [self.title, self.summary] + [f"{f['summary']} {f['explanation']}" for f in self.findings]
        return "\n".join(lines + self.questions)


@dataclass
class CommunityInput:
    community_id: str
    entities: list[tuple[str, str]]        # (name, description), hubs first
    relations: list[tuple[str, str, str]]  # (source, target, description)
    chunks: list[tuple[str, str]]          # (chunk_id, text)

    def key(self, model: str) -> str:
        return sha(f"{model}|{REPORT_VERSION}|{json.dumps(asdict(self), sort_keys=True)}", 40)

    def schema(self) -> dict:
        return report_schema(list(dict.fromkeys(n for n, _ in self.entities)), len(self.chunks))

    def prompt(self) -> str:
        return REPORT_PROMPT.format(
            entities="\n".join(f"- {n}: {d[:300]}" for n, d in self.entities) or "-",
            relations="\n".join(f"- {s} -> {t}: {d[:200]}" for s, t, d in self.relations) or "-",
            chunks="\n".join(f"[{i}] {text[:600]}" for i, (_, text) in enumerate(self.chunks, 1)) or "-")

    def validate(self, data: dict) -> CommunityReport:
        names = {n.lower(): n for n, _ in self.entities}
        findings = []
        for f in data["findings"]:
            cited = [self.chunks[int(n) - 1][0] for n in f.get("chunks", []) if 1 <= int(n) <= len(self.chunks)]
            ents = [names[str(e).lower()] for e in f.get("entities", []) if str(e).lower() in names]
            if not (ents or cited):  # a finding must cite something that exists
                continue
            findings.append({"summary": str(f["summary"]), "explanation": str(f.get("explanation", "")),
                             "entities": ents, "chunk_ids": list(dict.fromkeys(cited))})
        questions = [str(q).strip() for q in data["questions"] if str(q).strip()]
        if not findings or len(questions) < 3 or not str(data["title"]).strip() or not str(data["summary"]).strip():
            raise ValueError("report without cited findings, 3 questions, a title or a summary")
        return CommunityReport(self.community_id, str(data["title"]).strip(), str(data["summary"]).strip(),
                               min(max(float(data["rating"]), 0.0), 10.0), str(data["rating_reason"]).strip(),
                               findings, questions[:3])


def community_inputs(con: duckdb.DuckDBPyConnection, namespace: str, max_entities: int = 12, max_relations: int = 15,
                     max_chunks: int = 6) -> list[CommunityInput]:
    """Per community of two or more entities, at every level: its hubs (PageRank), their strongest inner
    relations, and the chunks that mention the most of them."""
    rows = community_members(con, namespace, "m.community_id, e.entity_id, e.name, coalesce(e.description, '')",
                             "m.community_id, s.pagerank DESC, e.name")
    members: dict[str, list[tuple[str, str, str]]] = defaultdict(list)
    for c, eid, name, desc in rows:
        members[c].append((eid, name, desc))
    out = []
    for c, ms in sorted(members.items()):
        if len(ms) < 2:
            continue
        hubs = ms[:max_entities]
        ids = [m[0] for m in hubs]
        rels = con.execute("""
            SELECT a.name, b.name, coalesce(r.description, '') FROM relations r
            JOIN entities a ON a.namespace = r.namespace AND a.entity_id = r.source_id
            JOIN entities b ON b.namespace = r.namespace AND b.entity_id = r.target_id
            WHERE r.namespace = ? AND r.source_id IN (SELECT unnest(?)) AND r.target_id IN (SELECT unnest(?))
            ORDER BY r.weight DESC, 1, 2 LIMIT ?""", [namespace, ids, ids, max_relations]).fetchall()
        chunks = con.execute("""
            SELECT m.chunk_id, any_value(c.text) FROM mentions m JOIN chunks c USING (namespace, chunk_id)
            WHERE m.namespace = ? AND m.entity_id IN (SELECT unnest(?))
            GROUP BY m.chunk_id ORDER BY count(*) DESC, sum(m.count) DESC, m.chunk_id LIMIT ?""",
                             [namespace, ids, max_chunks]).fetchall()
        out.append(CommunityInput(c, [(n, d) for _, n, d in hubs], [tuple(r) for r in rels], [tuple(r) for r in chunks]))
    return out


REPORT_COLUMNS = pa.schema([("community_id", pa.string()), ("title", pa.string()), ("summary", pa.string()),
                            ("rating", pa.float64()), ("rating_reason", pa.string()), ("findings", pa.string()),
                            ("questions", pa.list_(pa.string())), ("model", pa.string())])


def build_community_reports(settings: Settings, con: duckdb.DuckDBPyConnection, llm: OpenAIChat,
                            max_tokens: int = 800) -> tuple[list[CommunityReport], dict]:
    """One report per community (cached); failures (malformed JSON after retries) are counted and that
    community keeps its extractive summary. Endpoint errors stop the stage after caching what finished."""
    ns = settings.namespace
    inputs = community_inputs(con, ns)
    cache = JsonCache(settings.cache_dir / "llm.sqlite")
    try:
        hits = cache.get_many(i.key(llm.model) for i in inputs)

        def one(inp: CommunityInput) -> CommunityReport:
            key = inp.key(llm.model)
            if key in hits:
                return CommunityReport(**hits[key])
            report, _ = llm.complete_json(inp.prompt(), inp.schema(), operation="reports", max_tokens=max_tokens,
                                          validate=inp.validate)
            report.model = llm.model
            cache.put(key, asdict(report))
            return report

        results = llm.map(one, inputs)
    finally:
        cache.close()
    fatal = next((r for r in results if isinstance(r, LLMError)), None)
    if fatal is not None:
        raise fatal
    reports = [r for r in results if isinstance(r, CommunityReport)]
    failures = {i.community_id: f"{type(r).__name__}: {r}" for i, r in zip(inputs, results) if isinstance(r, Exception)}
    rows = [{**asdict(r), "findings": json.dumps(r.findings)} for r in reports]
    replace_rows(con, "community_reports", ns,
                 pa.Table.from_pylist(rows, REPORT_COLUMNS).append_column("namespace", pa.array([ns] * len(rows), pa.string()))
                 if rows else None)
    return reports, {"reports": len(reports), "report_failures": len(failures), "report_cached": len(hits),
                     "report_errors": failures}
