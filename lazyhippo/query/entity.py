"""One entity of a knowledge base as the graph holds it: description, type, PageRank, its communities from the
finest level up, its neighbours (relations with their descriptions and weights, then `SEMANTICALLY_SIMILAR`
entities) and the passages that mention it, with their citations. Read from the namespace's published index,
so every surface (CLI, HTTP, MCP) shows the same thing.

A name is matched as the index normalizes names; failing that, by similarity of the normalized names (DuckDB's
Jaro-Winkler, of the whole name or of one of its words) and by containment ("Marlow" in "Marlow Observatory"):
one clear candidate is taken, several are returned for the caller to choose from.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from lazyhippo.settings import Settings
from lazyhippo.stores.warehouse import connect

MIN_SIMILARITY = 0.85   # Jaro-Winkler of normalized names for a candidate
WORD_FACTOR = 0.95      # a name one of whose words is like the query ("Fenwik": Ada Fenwick) counts this much of it
CLEAR_MARGIN = 0.05     # the best candidate is taken when the next one is this much less similar
MAX_CANDIDATES = 10


@dataclass(frozen=True)
class Candidate:
    entity_id: str
    name: str
    type: str | None
    similarity: float
    pagerank: float


@dataclass
class EntityView:
    entity_id: str
    name: str
    type: str | None
    description: str | None
    pagerank: float | None
    mentions: int                      # mentions in all passages
    degree: int                        # relations
    communities: list[dict]            # finest level first: community_id, level, size, title
    neighbours: list[dict]             # entity_id, name, type, relation ("related" | "similar"), description, weight
    chunks: list[dict]                 # passages naming it, most mentions first: citation fields and text


@dataclass
class EntityLookup:
    query: str
    namespace: str
    match: str                         # exact | fuzzy | ambiguous | none
    entity: EntityView | None = None
    candidates: list[Candidate] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def lookup_entity(settings: Settings, name: str, neighbours: int = 20, chunks: int = 10) -> EntityLookup:
    """The entity `name` (a name or an entity id) of `settings.namespace`; see the module docstring for matching."""
    name = name.strip()
    if not name:
        raise ValueError("entity name is empty")
    if neighbours < 0 or chunks < 0:
        raise ValueError("neighbours and chunks must be 0 or more")
    ns = settings.namespace
    with connect(settings, read_only=True) as con:
        row = con.execute("SELECT entity_id FROM entities WHERE namespace = ? AND "
                          "(entity_id = ? OR norm_name = lh_norm(?))", [ns, name, name]).fetchone()
        if row is not None:
            return EntityLookup(name, ns, "exact", _view(con, ns, row[0], neighbours, chunks))
        found = [Candidate(*r) for r in con.execute("""
            WITH q AS (SELECT lh_norm(?) AS key)
            SELECT e.entity_id, e.name, e.type,
                   round(greatest(jaro_winkler_similarity(e.norm_name, q.key),
                                  ? * list_max(list_transform(string_split(e.norm_name, ' '),
                                                              lambda t: jaro_winkler_similarity(t, q.key))),
                                  CASE WHEN q.key <> '' AND (' ' || e.norm_name || ' ') LIKE ('% ' || q.key || ' %')
                                       THEN 0.9 ELSE 0 END), 4) AS similarity,
                   coalesce(s.pagerank, 0)
            FROM entities e, q LEFT JOIN entity_scores s ON s.namespace = e.namespace AND s.entity_id = e.entity_id
            WHERE e.namespace = ? AND similarity >= ?
            ORDER BY similarity DESC, coalesce(s.pagerank, 0) DESC, e.name LIMIT ?""",
            [name, WORD_FACTOR, ns, MIN_SIMILARITY, MAX_CANDIDATES]).fetchall()]
        if not found:
            return EntityLookup(name, ns, "none")
        if len(found) == 1 or found[0].similarity - found[1].similarity >= CLEAR_MARGIN:
            return EntityLookup(name, ns, "fuzzy", _view(con, ns, found[0].entity_id, neighbours, chunks), found)
        return EntityLookup(name, ns, "ambiguous", None, found)


def _view(con, ns: str, entity_id: str, n_neighbours: int, n_chunks: int) -> EntityView:
    p = {"ns": ns, "e": entity_id}
    name, type_, description, mentions, degree, pagerank, community = con.execute("""
        SELECT e.name, e.type, e.description, coalesce(e.mention_count, 0), coalesce(e.degree, 0), s.pagerank,
               s.community_id
        FROM entities e LEFT JOIN entity_scores s USING (namespace, entity_id)
        WHERE e.namespace = $ns AND e.entity_id = $e""", p).fetchone()
    communities = [dict(zip(("community_id", "level", "size", "title"), r)) for r in con.execute("""
        WITH RECURSIVE up(community_id, depth) AS (
            SELECT $c::VARCHAR, 0
            UNION ALL SELECT c.parent_id, up.depth + 1 FROM up JOIN communities c
                ON c.namespace = $ns AND c.community_id = up.community_id WHERE c.parent_id IS NOT NULL)
        SELECT c.community_id, c.level, c.size, m.title FROM up
        JOIN communities c ON c.namespace = $ns AND c.community_id = up.community_id
        LEFT JOIN community_summaries m ON m.namespace = $ns AND m.community_id = c.community_id
        ORDER BY up.depth""", {"ns": ns, "c": community}).fetchall()] if community else []
    neighbour_fields = ("entity_id", "name", "type", "relation", "description", "weight")
    neighbours = [dict(zip(neighbour_fields, r)) for r in con.execute("""
        SELECT o.entity_id, o.name, o.type, n.relation, n.description, round(n.weight, 4) FROM (
            SELECT CASE WHEN source_id = $e THEN target_id ELSE source_id END AS other, 'related' AS relation,
                   description, weight, 0 AS kind
            FROM relations WHERE namespace = $ns AND $e IN (source_id, target_id)
            UNION ALL
            SELECT CASE WHEN source_id = $e THEN target_id ELSE source_id END, 'similar', NULL, max(score), 1
            FROM knn_edges WHERE namespace = $ns AND $e IN (source_id, target_id) GROUP BY 1) n
        JOIN entities o ON o.namespace = $ns AND o.entity_id = n.other
        ORDER BY n.kind, n.weight DESC, o.name LIMIT $k""", {**p, "k": n_neighbours}).fetchall()]
    passages = [dict(zip(("chunk_id", "doc_id", "title", "source", "section", "page", "mentions", "text"), r))
                for r in con.execute("""
        SELECT c.chunk_id, c.doc_id, c.title, d.source, c.section, c.page, m.count, c.text
        FROM mentions m JOIN chunks c ON c.namespace = m.namespace AND c.chunk_id = m.chunk_id
        LEFT JOIN documents d ON d.namespace = c.namespace AND d.doc_id = c.doc_id
        WHERE m.namespace = $ns AND m.entity_id = $e
        ORDER BY m.count DESC, c.doc_id, c.position LIMIT $k""", {**p, "k": n_chunks}).fetchall()]
    return EntityView(entity_id, name, type_, description, pagerank, int(mentions), int(degree), communities,
                      neighbours, passages)
