"""The `entities` asset (with relations, mentions and facts): the SQL models of `dbt_like_sql/` over the
extracted rows, merges re-applied, long descriptions summarized when an LLM is configured.

Documents are the unit of change, and a changed document brings new chunks (a chunk's id holds its content's
hash): an update rebuilds only the rows its chunks can change. The stage records, per chunk, a hash of its
extracted rows and the entities they name (`stage_inputs`); the entities named by the chunks added, changed or
gone since then are the scope. An entity outside the scope has the same extracted rows as before, so its row,
its relations to other entities outside the scope, its mentions and the facts that name nothing in the scope
are unchanged; the models recompute the rest from the extracted rows that name an entity in the scope, which
are all the rows those outputs depend on. The degree of an entity is its number of relations, counted again
for the entities whose relations changed.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb
import polars as pl

from lazyhippo.settings import Settings
from lazyhippo.sql import SQL_DIR
from lazyhippo.stages.common import record_usage
from lazyhippo.stages.incremental import PARAMS, fingerprint, read_details, read_inputs, write_inputs
from lazyhippo.stages.reports import summarize_graph_descriptions
from lazyhippo.stages.results import GraphTablesResult
from lazyhippo.sources.files import sha
from lazyhippo.stores.warehouse import (
    chunk_relations,
    count,
    drop_temp,
    entity_inputs,
    extraction_inputs,
    fact_texts,
    name_keys,
    named,
    refresh_degree,
    run_sql_model,
    transaction,
)

MODELS = ("entities", "relations", "mentions", "facts")
BUCKET_CHUNKS = 25_000  # chunks whose named entities one query sorts (_chunk_entities)
STAGE = "entities"

# every name a chunk's extracted rows use, with the chunk: what an entity's rows depend on (a name stored as its
# place in a fact's names is among the facts' names)
_CHUNK_NAMES = """
    SELECT chunk_id, name FROM extracted_entities WHERE namespace = $ns AND name IS NOT NULL
    UNION ALL SELECT chunk_id, source FROM extracted_relations WHERE namespace = $ns AND source IS NOT NULL
    UNION ALL SELECT chunk_id, target FROM extracted_relations WHERE namespace = $ns AND target IS NOT NULL
    UNION ALL SELECT chunk_id, unnest(names) FROM extracted_facts WHERE namespace = $ns"""


@dataclass(frozen=True)
class Scope:
    """What an update rebuilds: the entities its chunks name, and the chunks gone or changed."""

    entity_ids: list[str]
    gone_chunks: list[str]
    new_chunks: list[str]


def _params(settings: Settings, llm) -> str:
    """The parameters the tables were built with: other parameters, other models or another describer (an LLM
    summarizes descriptions) rebuild everything."""
    models = "".join((SQL_DIR / f"{m}.sql").read_text() for m in MODELS)
    return f"{settings.relations_per_chunk}:{sha(models, 16)}:{llm.model if llm is not None else 'offline'}"


def _chunk_hashes(con: duckdb.DuckDBPyConnection, ns: str) -> dict[str, str]:
    """Chunk id -> row count and order-independent hash of its extracted rows (entities, relations, facts; a
    description or name that refers to a fact is covered by the fact's text and names; a fact's text read back
    from its span, so a home whose facts were rewritten as spans keeps its hashes)."""
    return dict(con.execute(f"""
        SELECT chunk_id, count(*) || ':' || sum(h) FROM (
            SELECT chunk_id, hash(name, type, description, fact_idx)::HUGEINT AS h
                      FROM ({named("extracted_entities")})
            UNION ALL SELECT chunk_id, hash(source, target, description, fact_idx, weight, type)::HUGEINT
                      FROM ({named("extracted_relations")})
            UNION ALL SELECT chunk_id, hash(fact_idx, text, names)::HUGEINT
                      FROM {fact_texts("extracted_facts")} WHERE namespace = $ns)
        GROUP BY chunk_id""", {"ns": ns}).fetchall())


def _chunk_entities(con: duckdb.DuckDBPyConnection, ns: str, chunks: list[str] | None) -> dict[str, str]:
    """Chunk id -> the entity ids its extracted rows name, sorted and joined by spaces (reads `lh_names`), for
    `chunks` (None: all). Pairs sorted in SQL and grouped here, BUCKET_CHUNKS chunks a query: a list per chunk
    in SQL is held in memory, and all pairs of 100,000 documents did not sort within DuckDB's cap; one string
    per chunk, not a list of them."""
    if chunks is None:
        n = con.execute("SELECT count(*) FROM chunks WHERE namespace = ?", [ns]).fetchall()[0][0]
        where, params, buckets = "", {}, max(1, -(-n // BUCKET_CHUNKS))
    else:
        where, params, buckets = "AND x.chunk_id IN (SELECT unnest($chunks::VARCHAR[]))", {"chunks": chunks}, 1
    named: dict[str, str] = {}
    for bucket in range(buckets):
        reader = con.sql(f"""
            SELECT DISTINCT x.chunk_id, k.entity_id
            FROM ({_CHUNK_NAMES}) x JOIN lh_names k ON k.name = x.name AND k.norm_name <> ''
            WHERE hash(x.chunk_id) % $buckets = $bucket {where}
            ORDER BY x.chunk_id, k.entity_id""", params={"ns": ns, "buckets": buckets, "bucket": bucket, **params}
                         ).to_arrow_reader(100_000)
        for batch in reader:
            for chunk, ids in pl.from_arrow(batch).group_by("chunk_id", maintain_order=True).agg(
                    pl.col("entity_id").str.join(" ")).iter_rows():
                named[chunk] = f"{named[chunk]} {ids}" if chunk in named else ids  # a chunk across two batches
    return named


def plan_scope(con: duckdb.DuckDBPyConnection, ns: str, params: str,
               hashes: dict[str, str]) -> tuple[Scope | None, dict[str, tuple[str, str] | str]]:
    """The scope of an update against the recorded inputs, or None when the graph tables are rebuilt whole
    (first run, other parameters); and the inputs to record afterwards: per chunk, its rows' hash and the
    entity ids they name (read back when the chunk is gone)."""
    before = read_inputs(con, ns, STAGE)
    if not before or before.get(PARAMS) != fingerprint(params):
        return None, {}
    now = {c: fingerprint(h) for c, h in hashes.items()}
    gone = sorted(c for c, f in before.items() if c != PARAMS and now.get(c) != f)
    new = sorted(c for c, f in now.items() if before.get(c) != f)
    recorded = read_details(con, ns, STAGE)
    named = _chunk_entities(con, ns, new)
    ids = {e for c in gone for e in recorded.get(c, "").split()} | {e for c in new for e in named.get(c, "").split()}
    fresh = set(new)
    inputs = {c: (h, (named if c in fresh else recorded).get(c, "")) for c, h in hashes.items()}
    return Scope(sorted(ids), gone, new), {**inputs, PARAMS: params}


def _scoped_inputs(con: duckdb.DuckDBPyConnection, ns: str, scope: Scope) -> None:
    """Narrow the models' inputs (`lh_entities`, `lh_facts`, `lh_relations`) to the extracted rows that name an
    entity in the scope (and every fact of a new chunk); `lh_scope` holds the entity ids, `lh_gone` the chunks
    whose rows went."""
    p = {"ns": ns}
    con.execute("CREATE OR REPLACE TEMP TABLE lh_scope AS SELECT unnest($ids::VARCHAR[]) AS entity_id",
                {"ids": scope.entity_ids})
    con.execute("CREATE OR REPLACE TEMP TABLE lh_gone AS SELECT unnest($c::VARCHAR[]) AS chunk_id",
                {"c": scope.gone_chunks})
    con.execute("CREATE OR REPLACE TEMP TABLE lh_scope_names AS "
                "SELECT name FROM lh_names WHERE entity_id IN (SELECT entity_id FROM lh_scope)")
    for name in ("lh_entities", "lh_facts"):
        drop_temp(con, name)
    con.execute(f"CREATE TEMP TABLE lh_entities AS SELECT * FROM ({named('extracted_entities')}) "
                "WHERE name IN (SELECT name FROM lh_scope_names)", p)
    con.execute("""CREATE TEMP TABLE lh_facts AS SELECT * FROM extracted_facts f
        WHERE namespace = $ns AND (chunk_id IN (SELECT unnest($new::VARCHAR[])) OR (chunk_id, fact_idx) IN (
            SELECT (chunk_id, fact_idx) FROM (SELECT chunk_id, fact_idx, unnest(names) AS name FROM extracted_facts
                                               WHERE namespace = $ns) WHERE name IN (SELECT name FROM lh_scope_names)))""",
                {**p, "new": scope.new_chunks})
    chunk_relations(con, ns, 0, "lh_scope_names")


_IN_SCOPE = "(SELECT entity_id FROM lh_scope)"
# the rows of each table an update's inputs can change (conditions on that table's rows)
SCOPES = {
    "entities": f"entity_id IN {_IN_SCOPE}",
    "relations": f"source_id IN {_IN_SCOPE} OR target_id IN {_IN_SCOPE}",
    "mentions": f"entity_id IN {_IN_SCOPE} OR chunk_id IN (SELECT chunk_id FROM lh_gone)",
    "facts": "chunk_id IN (SELECT chunk_id FROM lh_gone) OR fact_id IN (SELECT fact_id FROM lh_model)",
}


def _update_scope(con: duckdb.DuckDBPyConnection, ns: str, scope: Scope) -> None:
    _scoped_inputs(con, ns, scope)
    ends = f"SELECT source_id AS id FROM relations WHERE namespace = $ns AND ({SCOPES['relations']}) " \
           f"UNION SELECT target_id FROM relations WHERE namespace = $ns AND ({SCOPES['relations']})"
    touched = {r[0] for r in con.execute(ends, {"ns": ns}).fetchall()}  # relations about to change, before
    for m in MODELS:
        run_sql_model(con, m, ns, SCOPES[m])
    touched |= {r[0] for r in con.execute(ends, {"ns": ns}).fetchall()} | set(scope.entity_ids)
    refresh_degree(con, ns, sorted(touched))


def build_graph_tables(settings: Settings, con: duckdb.DuckDBPyConnection, llm=None,
                       run_id: str | None = None) -> GraphTablesResult:
    """The SQL models, in dependency order: the kept entities filter relations, mentions and facts. With an
    LLM, long entity and relation descriptions are then summarized (map-reduce, cached). Recorded merges, an LLM
    or a cap on relations per chunk (whose strengths are corpus-wide) rebuild the tables whole."""
    from lazyhippo.stages.merge import apply_merges, summarize_merges

    ns = settings.namespace
    name_keys(con, ns)
    extraction_inputs(con, ns)
    params = _params(settings, llm)
    hashes = _chunk_hashes(con, ns)
    merges = count(con, "entity_merges", ns)
    scope, inputs = (None, {}) if merges or llm is not None or settings.relations_per_chunk \
        else plan_scope(con, ns, params, hashes)
    merged = 0
    if scope is None:
        chunk_relations(con, ns, settings.relations_per_chunk)
        entity_inputs(con, ns)
        for m in MODELS:
            run_sql_model(con, m, ns)
        merged = apply_merges(con, ns)  # recorded entity merges, folded in again
        named = _chunk_entities(con, ns, None)
        inputs = {**{c: (h, named.get(c, "")) for c, h in hashes.items()}, PARAMS: params}
    elif scope.entity_ids or scope.gone_chunks:
        _update_scope(con, ns, scope)
    with transaction(con):
        write_inputs(con, ns, STAGE, inputs)
    counts = {t: count(con, t, ns) for t in MODELS}
    counts["merged_entities"] = merged
    counts["scoped_entities"] = None if scope is None else len(scope.entity_ids)
    if llm is None:
        return GraphTablesResult(**counts)
    before = llm.meter.snapshot()
    try:
        summarized = summarize_graph_descriptions(settings, con, llm)
        summarize_merges(settings, con, llm)  # after them: a merged target is described from every merged name
    finally:
        usage = record_usage(con, ns, run_id, llm, before)
    return GraphTablesResult(**counts, **summarized, llm_usage=usage)
