"""Entity merge: SOURCE entities folded into a TARGET, recorded so every later rebuild applies it again.

A merge is stored by normalized names in `entity_merges`; `apply_merges` runs right after the SQL models
(entities, relations, mentions, facts), so a reindex that recreates the source entities folds them again.
Relations are redirected to the target, self-loops dropped, duplicate pairs combined (weights and chunk
counts added, descriptions joined); mentions and facts follow; the sources (and their vectors) go. A target no
entity has yet is created (named as given, typed like the first source). The `llm_summary` strategy has the
LLM write the target's description from every description of the merged names (`summarize_merges`).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from lazyhippo.stores.warehouse import described, refresh_degree

STRATEGIES = ("concatenate", "keep_first", "keep_longest", "llm_summary")
LLM_STRATEGY = "llm_summary"


class UnknownEntityError(ValueError):
    """An entity name or id the namespace does not hold."""


@dataclass(frozen=True)
class Merge:
    source_ids: tuple[str, ...]
    target_id: str
    target_name: str
    strategy: str
    created: bool = False             # the target is a new entity

def check_strategy(strategy: str, llm_configured: bool) -> str:
    """`strategy` when it can be used here: `llm_summary` needs an LLM."""
    if strategy not in STRATEGIES:
        raise ValueError(f"--strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == LLM_STRATEGY and not llm_configured:
        raise ValueError("--strategy llm_summary needs an LLM: set OPENAI_BASE_URL (or OPENAI_API_KEY) and "
                         "LAZYHIPPO_LLM=openai, or choose concatenate, keep_first or keep_longest")
    return strategy


def resolve_entities(con: duckdb.DuckDBPyConnection, ns: str, refs: list[str]) -> dict[str, tuple[str, str]]:
    """ref -> (entity_id, norm_name) for refs naming an entity id or (normalized) name; unknown refs raise."""
    found, missing = {}, []
    for ref in refs:
        row = con.execute("SELECT entity_id, norm_name FROM entities WHERE namespace = ? AND "
                          "(entity_id = ? OR norm_name = lh_norm(?))", [ns, ref, ref]).fetchone()
        if row is None:
            missing.append(ref)
        else:
            found[ref] = row
    if missing:
        raise UnknownEntityError(f"namespace {ns!r} has no entity {', '.join(map(repr, missing))} "
                                 "(give an entity name or id as in the entities table)")
    return found


def record_merge(con: duckdb.DuckDBPyConnection, ns: str, sources: list[str], target: str, strategy: str,
                 llm_configured: bool = False) -> Merge:
    """Validate and record a merge (applied by the next graph rebuild); bad input changes nothing. A target that
    names no entity is created by the rebuild."""
    check_strategy(strategy, llm_configured)
    if not target.strip():
        raise ValueError("--into is empty: name the entity that remains")
    found = resolve_entities(con, ns, list(sources))
    existing = con.execute("SELECT entity_id, norm_name, name FROM entities WHERE namespace = ? AND "
                           "(entity_id = ? OR norm_name = lh_norm(?))", [ns, target, target]).fetchone()
    if existing is None:
        target_norm = con.execute("SELECT lh_norm(?)", [target.strip()]).fetchone()[0]
        if not target_norm:
            raise ValueError(f"--into {target!r} has no letters or digits to name an entity by")
        target_id = con.execute("SELECT 'e_' || substr(sha256(?), 1, 16)", [target_norm]).fetchone()[0]
        name = target.strip()
    else:
        target_id, target_norm, name = existing
    source_rows = set(found.values()) - {(target_id, target_norm)}
    if not source_rows:
        raise ValueError("nothing to merge: every source is the target itself")
    seq = con.execute("SELECT coalesce(max(seq), 0) + 1 FROM entity_merges WHERE namespace = ?", [ns]).fetchone()[0]
    con.executemany("INSERT INTO entity_merges (namespace, source_norm, target_norm, strategy, seq, target_name) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    [(ns, norm, target_norm, strategy, seq, None if existing else name)
                     for _, norm in sorted(source_rows)])
    return Merge(tuple(sorted(i for i, _ in source_rows)), target_id, name, strategy, created=existing is None)


# over `descs`: the non-empty descriptions, the target's first, then the sources' in name order
_DESCRIPTION = {
    "concatenate": "array_to_string(list_filter(descs, lambda d, i: list_position(descs, d) = i), ' | ')",
    "keep_first": "descs[1]",
    "keep_longest": "list_reduce(descs, lambda a, b: CASE WHEN length(b) > length(a) THEN b ELSE a END)",
}
_DESCRIPTION[LLM_STRATEGY] = _DESCRIPTION["concatenate"]  # until (and without) an LLM: summarize_merges


def _fold(con: duckdb.DuckDBPyConnection, ns: str, source_ids: list[str], target_id: str, strategy: str) -> None:
    con.execute("CREATE OR REPLACE TEMP TABLE _merge_src AS SELECT unnest(?::VARCHAR[]) AS id", [source_ids])
    ids = "(SELECT id FROM _merge_src)"
    order = "CASE WHEN entity_id = $t THEN 0 ELSE 1 END, name"
    p = {"ns": ns, "t": target_id}
    con.execute(f"""UPDATE entities SET description = m.description, mention_count = m.mention_count FROM (
        SELECT {_DESCRIPTION[strategy]} AS description, total AS mention_count FROM (
            SELECT list(description ORDER BY {order}) FILTER (WHERE coalesce(description, '') <> '') AS descs,
                   sum(mention_count) AS total
            FROM entities WHERE namespace = $ns AND (entity_id = $t OR entity_id IN {ids}))) m
        WHERE namespace = $ns AND entity_id = $t""", p)
    mapped = f"CASE WHEN {{col}} IN {ids} THEN $t ELSE {{col}} END"
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _rel AS
        WITH m AS (SELECT {mapped.format(col='source_id')} AS a, {mapped.format(col='target_id')} AS b,
                          description, weight, n_chunks, type, forward  -- the type reads a -> b
                   FROM relations WHERE namespace = $ns)
        SELECT $ns AS namespace, least(a, b) AS source_id, greatest(a, b) AS target_id,
               CASE WHEN count(*) = 1 THEN first(description)
                    ELSE string_agg(DISTINCT description, ' | ' ORDER BY description) END AS description,
               sum(weight) AS weight, sum(n_chunks) AS n_chunks,
               first(type ORDER BY type = 'RELATED_TO', weight DESC, type) AS type,
               first(forward = (a < b) OR type = 'RELATED_TO' ORDER BY type = 'RELATED_TO', weight DESC, type) AS forward
        FROM m WHERE a <> b GROUP BY least(a, b), greatest(a, b)""", p)
    con.execute("DELETE FROM relations WHERE namespace = $ns", {"ns": ns})
    con.execute("INSERT INTO relations BY NAME SELECT * FROM _rel")
    con.execute(f"""CREATE OR REPLACE TEMP TABLE _men AS
        SELECT $ns AS namespace, chunk_id, {mapped.format(col='entity_id')} AS entity_id, sum(count) AS count
        FROM mentions WHERE namespace = $ns GROUP BY ALL""", p)
    con.execute("DELETE FROM mentions WHERE namespace = $ns", {"ns": ns})
    con.execute("INSERT INTO mentions BY NAME SELECT * FROM _men")
    con.execute("""UPDATE facts SET entity_ids = list_sort(list_distinct(
            list_transform(entity_ids, lambda e: CASE WHEN list_contains($src, e) THEN $t ELSE e END)))
        WHERE namespace = $ns AND list_has_any(entity_ids, $src)""", {**p, "src": source_ids})
    con.execute(f"DELETE FROM entities WHERE namespace = $ns AND entity_id IN {ids}", {"ns": ns})
    con.execute(f"DELETE FROM embeddings WHERE namespace = $ns AND kind = 'entity' AND item_id IN {ids}", {"ns": ns})
    refresh_degree(con, ns)


def _merges(con: duckdb.DuckDBPyConnection, ns: str) -> list[tuple]:
    """(seq, strategy, target id, target name or None, source ids, target norm, source norms) in merge order."""
    return con.execute("""
        SELECT seq, any_value(strategy), any_value('e_' || substr(sha256(target_norm), 1, 16)), any_value(target_name),
               list('e_' || substr(sha256(source_norm), 1, 16)), any_value(target_norm), list(source_norm)
        FROM entity_merges WHERE namespace = ? GROUP BY seq ORDER BY seq""", [ns]).fetchall()


def apply_merges(con: duckdb.DuckDBPyConnection, ns: str) -> int:
    """Fold every recorded merge, in the order they were made, into freshly built graph tables."""
    folded = 0
    for _, strategy, target_id, target_name, source_ids, target_norm, _ in _merges(con, ns):
        present = {r[0] for r in con.execute("SELECT entity_id FROM entities WHERE namespace = ? AND entity_id IN "
                                             "(SELECT unnest(?))", [ns, [target_id, *source_ids]]).fetchall()}
        sources = [s for s in source_ids if s in present and s != target_id]
        if sources and target_id not in present and target_name:  # a new entity: typed like the first source
            con.execute("""INSERT INTO entities BY NAME
                SELECT namespace, $t AS entity_id, $name AS name, $norm AS norm_name, type, NULL AS description,
                       0 AS mention_count, 0 AS degree
                FROM entities WHERE namespace = $ns AND entity_id IN (SELECT unnest($src)) ORDER BY name LIMIT 1""",
                        {"ns": ns, "t": target_id, "name": target_name, "norm": target_norm, "src": sources})
            present.add(target_id)
        if target_id in present and sources:  # an entity gone from the corpus has nothing to fold
            _fold(con, ns, sources, target_id, strategy)
            folded += len(sources)
    return folded


def summarize_merges(settings, con: duckdb.DuckDBPyConnection, llm) -> int:
    """The `llm_summary` merges' targets described by the LLM from every extracted description of the names
    merged into them (cached like the other description summaries); how many were written."""
    from lazyhippo.stages.summaries import summarize_descriptions
    from lazyhippo.stores.cache import JsonCache

    ns = settings.namespace
    done = 0
    cache = JsonCache(settings.cache_dir / "llm.sqlite")
    try:
        for _, strategy, target_id, _, _, target_norm, source_norms in _merges(con, ns):
            row = con.execute("SELECT name FROM entities WHERE namespace = ? AND entity_id = ?",
                              [ns, target_id]).fetchone()
            if strategy != LLM_STRATEGY or row is None:
                continue
            descriptions = [d for (d,) in con.execute(
                f"SELECT DISTINCT description FROM ({described('extracted_entities')}) WHERE "
                "coalesce(description, '') <> '' AND lh_norm(name) IN (SELECT unnest($names)) ORDER BY description",
                {"ns": ns, "names": [target_norm, *source_norms]}).fetchall()]
            if descriptions:
                text = summarize_descriptions(llm, "the entity", row[0], descriptions, cache)
                con.execute("UPDATE entities SET description = ? WHERE namespace = ? AND entity_id = ?",
                            [text, ns, target_id])
                done += 1
    finally:
        cache.close()
    return done


def merge_on_neo4j(store, ns: str, merge: Merge) -> dict:
    """One Cypher statement, so one transaction: relationships of the sources redirected to the target (pairs
    combined, self-loops dropped), mentions moved, the sources deleted. The graph stages resync afterwards."""
    rows = store.query("""
        MATCH (t:Entity {namespace: $ns, id: $target})
        MATCH (s:Entity {namespace: $ns}) WHERE s.id IN $sources
        CALL (s, t) {
            MATCH (s)-[r]-(o:Entity) WHERE r.id IS NOT NULL AND o <> t AND NOT o.id IN $sources
            WITH t, o, r, CASE WHEN startNode(r) = s THEN [t, o] ELSE [o, t] END AS ends
            WITH ends[0] AS a, ends[1] AS b, r
            MERGE (a)-[n:$(type(r))]->(b)
            ON CREATE SET n.weight = 0.0, n.n_chunks = 0, n.namespace = $ns, n.description = r.description
            SET n.weight = n.weight + r.weight, n.n_chunks = n.n_chunks + coalesce(r.n_chunks, 0)
            RETURN count(*) AS rels
        }
        CALL (s, t) {
            MATCH (c:Chunk)-[m:MENTIONS]->(s)
            MERGE (c)-[n:MENTIONS]->(t) ON CREATE SET n.count = 0, n.namespace = $ns, n.is_title = m.is_title
            SET n.count = n.count + m.count
            RETURN count(*) AS mentions
        }
        DETACH DELETE s
        RETURN sum(rels) AS relations, sum(mentions) AS mentions, count(*) AS removed""",
                       {"ns": ns, "target": merge.target_id, "sources": list(merge.source_ids)}, write=True)
    return rows[0] if rows else {"relations": 0, "mentions": 0, "removed": 0}
