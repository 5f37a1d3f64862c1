"""The only writer of the served graph: pushes what an asset produced in DuckDB to Neo4j.

Rows leave DuckDB as Arrow into polars frames (nested `props` built in SQL as structs) and reach Neo4j as
batched `UNWIND $rows AS row MERGE ...` on the (namespace, id) keys, so re-materializing creates no
duplicate; every write stamps `sync_token`, and what a sync did not stamp in its namespace is deleted afterwards
(merge + delete stale). Labels and relationship types are constants here; all values travel as parameters.
"""

from __future__ import annotations

import uuid

import polars as pl

from lazyhippo.stores.neo4j.client import RELATIONS, Neo4jClient
from lazyhippo.stores.warehouse import float_vector_sql

# assets whose rows change the graph PPR walks: the namespace's graph version is bumped after them
GRAPH_ASSETS = frozenset({"documents", "chunks", "entities", "knn_edges"})


class Neo4jSync:
    def __init__(self, client: Neo4jClient):
        self.client = client
        self.steps = {"documents": self._documents, "chunks": self._chunks, "entities": self._entities,
                      "knn_edges": self._knn_edges, "communities": self._communities,
                      "community_summaries": self._summaries}

    def __call__(self, con, namespace: str, asset: str) -> dict:
        """Push the warehouse rows `asset` produced (merge + delete stale); figures for metadata.
        Assets that put nothing in the served graph return {}."""
        step = self.steps.get(asset)
        if step is None:
            return {}
        self.client.ensure_schema()
        token = uuid.uuid4().hex
        out = step(con, namespace, token)
        if asset in GRAPH_ASSETS:
            self.client.bump_version(namespace, token)
        return out

    def _merge_nodes(self, label: str, ns: str, rows: pl.DataFrame, token: str) -> dict:
        """rows: id, props (a struct); replaces the namespace's `label` nodes."""
        c = self.client
        n = c.write_batches(f"UNWIND $rows AS row MERGE (n:{label} {{namespace: $ns, id: row.id}}) "
                            f"SET n += row.props, n.sync_token = $token RETURN count(n) AS n", rows, {"ns": ns, "token": token})
        before = c.count_nodes(ns, label)
        c.autocommit(f"MATCH (n:{label} {{namespace: $ns}}) WHERE n.sync_token IS NULL OR n.sync_token <> $token "
                     f"CALL (n) {{ DETACH DELETE n }} IN TRANSACTIONS OF 5000 ROWS", {"ns": ns, "token": token},
                     "deleting stale nodes")
        return {f"{label.lower()}_nodes": n, f"{label.lower()}_deleted": before - c.count_nodes(ns, label)}

    def _merge_rels(self, rel: str, src: str, dst: str, ns: str, rows: pl.DataFrame, token: str) -> dict:
        """rows: s (source id), t (target id), props (a struct, or no column: none); replaces the namespace's
        `rel` relationships."""
        c = self.client
        n = c.write_batches(f"UNWIND $rows AS row "
                            f"MATCH (a:{src} {{namespace: $ns, id: row.s}}) MATCH (b:{dst} {{namespace: $ns, id: row.t}}) "
                            f"MERGE (a)-[r:{rel}]->(b) SET r += coalesce(row.props, {{}}), r.namespace = $ns, "
                            f"r.sync_token = $token RETURN count(r) AS n", rows, {"ns": ns, "token": token})
        c.autocommit(f"MATCH (a:{src} {{namespace: $ns}})-[r:{rel}]->() WHERE r.sync_token IS NULL OR r.sync_token <> $token "
                     f"CALL (r) {{ DELETE r }} IN TRANSACTIONS OF 10000 ROWS", {"ns": ns, "token": token},
                     "deleting stale relationships")
        return {rel.lower(): n, f"{rel.lower()}_missing_endpoints": rows.height - n}

    def _merge_relations(self, ns: str, rows: pl.DataFrame, token: str) -> dict:
        """rows: s, t, type, props; replaces the namespace's relations between entities (whatever their type)."""
        c = self.client
        n = c.write_batches("UNWIND $rows AS row MATCH (a:Entity {namespace: $ns, id: row.s}) "
                            "MATCH (b:Entity {namespace: $ns, id: row.t}) MERGE (a)-[r:$(row.type)]->(b) "
                            "SET r += row.props, r.namespace = $ns, r.sync_token = $token RETURN count(r) AS n",
                            rows, {"ns": ns, "token": token})
        c.autocommit(f"MATCH {RELATIONS} AND (r.sync_token IS NULL OR r.sync_token <> $token) "
                     "CALL (r) { DELETE r } IN TRANSACTIONS OF 10000 ROWS", {"ns": ns, "token": token},
                     "deleting stale relations")
        return {"relations": n, "relations_missing_endpoints": rows.height - n}

    def _set_on_entities(self, ns: str, cypher_set: str, rows: pl.DataFrame, clear: str) -> int:
        """SET properties on entities by id; the entities not in `rows` lose them (`clear`: REMOVE list)."""
        c = self.client
        n = c.write_batches(f"UNWIND $rows AS row MATCH (e:Entity {{namespace: $ns, id: row.id}}) SET {cypher_set} "
                            f"RETURN count(e) AS n", rows, {"ns": ns})
        c.query(f"MATCH (e:Entity {{namespace: $ns}}) WHERE NOT e.id IN $ids REMOVE {clear}",
                {"ns": ns, "ids": rows["id"].to_list()}, write=True)
        return n

    @staticmethod
    def _rows(con, sql: str, ns: str) -> pl.DataFrame:
        """The namespace's rows of `sql` (its one parameter), handed from DuckDB to polars as Arrow."""
        return con.sql(sql, params=[ns]).pl()

    def _documents(self, con, ns, token) -> dict:
        rows = self._rows(con, "SELECT doc_id AS id, struct_pack(source, title, kind, content_hash, n_chars) AS props "
                               "FROM documents WHERE namespace = ? ORDER BY doc_id", ns)
        return self._merge_nodes("Document", ns, rows, token)

    def _chunks(self, con, ns, token) -> dict:
        rows = self._rows(con, "SELECT chunk_id AS id, struct_pack(doc_id, title, position, section, page, text, "
                               "content_hash, n_tokens) AS props FROM chunks WHERE namespace = ? ORDER BY chunk_id", ns)
        out = self._merge_nodes("Chunk", ns, rows, token)
        props = pl.col("props").struct
        out.update(self._merge_rels("PART_OF", "Chunk", "Document", ns,
                                    rows.select(s="id", t=props.field("doc_id"), props=pl.struct(props.field("position"))),
                                    token))
        return out

    def _entities(self, con, ns, token) -> dict:
        """Entities with their relations and mentions (the `entity_graph_tables` multi-asset)."""
        rows = self._rows(con, "SELECT entity_id AS id, struct_pack(name, norm_name, type, description, mention_count, "
                               "degree) AS props FROM entities WHERE namespace = ? ORDER BY entity_id", ns)
        out = self._merge_nodes("Entity", ns, rows, token)
        labels = self._rows(con, "SELECT entity_id AS id, CASE WHEN regexp_matches(label, '^[A-Z][A-Z0-9_]*$') "
                                 "THEN [label] ELSE [] END AS labels FROM (SELECT entity_id, upper(trim(regexp_replace("
                                 "coalesce(type, ''), '[^A-Za-z0-9]+', '_', 'g'), '_')) AS label FROM entities "
                                 "WHERE namespace = ?) ORDER BY id", ns)
        out["entities_labelled"] = self.client.write_batches(
            "UNWIND $rows AS row MATCH (e:Entity {namespace: $ns, id: row.id}) "
            "WITH e, row, [l IN labels(e) WHERE l <> 'Entity' AND NOT l IN row.labels] AS old "
            "REMOVE e:$(old) SET e:$(row.labels) RETURN count(e) AS n", labels, {"ns": ns})
        # each relation as its type, in the direction the type reads
        rels = self._rows(con, "SELECT CASE WHEN forward THEN source_id ELSE target_id END AS s, CASE WHEN forward "
                               "THEN target_id ELSE source_id END AS t, type, struct_pack(id := relation_id, weight, "
                               "description, n_chunks) AS props FROM relations WHERE namespace = ? ORDER BY relation_id", ns)
        out.update(self._merge_relations(ns, rels, token))
        # is_title: the chunk's document title names the entity (same normalization as the entity ids)
        mentions = self._rows(con, """
            SELECT m.chunk_id AS s, m.entity_id AS t, struct_pack(count := m.count, is_title := coalesce(
                       e.norm_name = lh_norm(c.title)
                       OR e.norm_name = lh_norm(regexp_replace(c.title, '^(?i)(the|a|an)\\s+', '')), false)) AS props
            FROM mentions m
            LEFT JOIN chunks c ON c.namespace = m.namespace AND c.chunk_id = m.chunk_id
            LEFT JOIN entities e ON e.namespace = m.namespace AND e.entity_id = m.entity_id
            WHERE m.namespace = ? ORDER BY m.chunk_id, m.entity_id""", ns)
        out.update(self._merge_rels("MENTIONS", "Chunk", "Entity", ns, mentions, token))
        return out

    def _knn_edges(self, con, ns, token) -> dict:
        """The entity text embeddings and the SEMANTICALLY_SIMILAR edges, as the warehouse holds them."""
        vectors = self._rows(con, f"SELECT item_id AS id, {float_vector_sql(con)} AS v FROM embeddings WHERE namespace = ? AND kind = 'entity' "
                                  "ORDER BY item_id", ns)
        out = {"embeddings_written": self._set_on_entities(ns, "e.embedding = row.v", vectors, "e.embedding")}
        rows = self._rows(con, "SELECT source_id AS s, target_id AS t, struct_pack(score, rank) AS props FROM knn_edges "
                               "WHERE namespace = ? ORDER BY source_id, target_id", ns)
        out.update(self._merge_rels("SEMANTICALLY_SIMILAR", "Entity", "Entity", ns, rows, token))
        return out

    def _communities(self, con, ns, token) -> dict:
        rows = self._rows(con, "SELECT community_id AS id, struct_pack(level, size, modularity, parent_id) AS props "
                               "FROM communities WHERE namespace = ? ORDER BY community_id", ns)
        out = self._merge_nodes("Community", ns, rows, token)
        # the levels: a community BELONGS_TO the community of the level above that holds it
        parents = self._merge_rels("BELONGS_TO", "Community", "Community", ns, self._rows(
            con, "SELECT community_id AS s, parent_id AS t FROM communities WHERE namespace = ? AND parent_id IS NOT NULL "
                 "ORDER BY community_id", ns), token)
        out.update({f"community_{k}": v for k, v in parents.items()})
        scores = self._rows(con, "SELECT entity_id AS id, community_id AS c, pagerank AS pr FROM entity_scores "
                                 "WHERE namespace = ? ORDER BY entity_id", ns)
        out["scored_entities"] = self._set_on_entities(ns, "e.community_id = row.c, e.pagerank = row.pr", scores,
                                                       "e.community_id, e.pagerank")
        out.update(self._merge_rels("BELONGS_TO", "Entity", "Community", ns, scores.select(s="id", t="c"), token))
        return out

    def _summaries(self, con, ns, token) -> dict:
        rows = self._rows(con, "SELECT community_id AS id, title, summary, coalesce(hub_entities, []) AS hubs "
                               "FROM community_summaries WHERE namespace = ? ORDER BY community_id", ns)
        n = self.client.write_batches("UNWIND $rows AS row MATCH (c:Community {namespace: $ns, id: row.id}) "
                                      "SET c.title = row.title, c.summary = row.summary, c.hub_entities = row.hubs "
                                      "RETURN count(c) AS n", rows, {"ns": ns})
        self.client.query("MATCH (c:Community {namespace: $ns}) WHERE NOT c.id IN $ids "
                          "REMOVE c.title, c.summary, c.hub_entities", {"ns": ns, "ids": rows["id"].to_list()}, write=True)
        return {"summaries": n, "summaries_missing_community": rows.height - n}
