"""The only writer of the served graph: pushes what an asset produced in DuckDB to Neo4j.

Loading is batched `UNWIND $rows AS row MERGE ...` on the (namespace, id) keys, so re-materializing creates no
duplicate; every write stamps `sync_token`, and what a sync did not stamp in its namespace is deleted afterwards
(merge + delete stale). Labels and relationship types are constants here; all values travel as parameters.
"""

from __future__ import annotations

import uuid

import numpy as np

from lazyhippo.stores.neo4j.client import Neo4jClient
from lazyhippo.stores.warehouse import read_vectors

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

    def _merge_nodes(self, label: str, ns: str, rows: list[dict], token: str) -> dict:
        """rows: {"id": ..., "props": {...}}; replaces the namespace's `label` nodes."""
        c = self.client
        n = c.write_batches(f"UNWIND $rows AS row MERGE (n:{label} {{namespace: $ns, id: row.id}}) "
                            f"SET n += row.props, n.sync_token = $token RETURN count(n) AS n", rows, {"ns": ns, "token": token})
        before = c.count_nodes(ns, label)
        c.autocommit(f"MATCH (n:{label} {{namespace: $ns}}) WHERE n.sync_token IS NULL OR n.sync_token <> $token "
                     f"CALL (n) {{ DETACH DELETE n }} IN TRANSACTIONS OF 5000 ROWS", {"ns": ns, "token": token},
                     "deleting stale nodes")
        return {f"{label.lower()}_nodes": n, f"{label.lower()}_deleted": before - c.count_nodes(ns, label)}

    def _merge_rels(self, rel: str, src: str, dst: str, ns: str, rows: list[dict], token: str) -> dict:
        """rows: {"s": source id, "t": target id, "props": {...}}; replaces the namespace's `rel` relationships."""
        c = self.client
        n = c.write_batches(f"UNWIND $rows AS row "
                            f"MATCH (a:{src} {{namespace: $ns, id: row.s}}) MATCH (b:{dst} {{namespace: $ns, id: row.t}}) "
                            f"MERGE (a)-[r:{rel}]->(b) SET r += row.props, r.namespace = $ns, r.sync_token = $token "
                            f"RETURN count(r) AS n", rows, {"ns": ns, "token": token})
        c.autocommit(f"MATCH (a:{src} {{namespace: $ns}})-[r:{rel}]->() WHERE r.sync_token IS NULL OR r.sync_token <> $token "
                     f"CALL (r) {{ DELETE r }} IN TRANSACTIONS OF 10000 ROWS", {"ns": ns, "token": token},
                     "deleting stale relationships")
        return {rel.lower(): n, f"{rel.lower()}_missing_endpoints": len(rows) - n}

    def _set_on_entities(self, ns: str, cypher_set: str, rows: list[dict], clear: str) -> int:
        """SET properties on entities by id; the entities not in `rows` lose them (`clear`: REMOVE list)."""
        c = self.client
        n = c.write_batches(f"UNWIND $rows AS row MATCH (e:Entity {{namespace: $ns, id: row.id}}) SET {cypher_set} "
                            f"RETURN count(e) AS n", rows, {"ns": ns})
        c.query(f"MATCH (e:Entity {{namespace: $ns}}) WHERE NOT e.id IN $ids REMOVE {clear}",
                {"ns": ns, "ids": [r["id"] for r in rows]}, write=True)
        return n

    def _documents(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"source": r[1], "title": r[2], "kind": r[3], "content_hash": r[4], "n_chars": r[5]}}
                for r in con.execute("SELECT doc_id, source, title, kind, content_hash, n_chars FROM documents "
                                     "WHERE namespace = ? ORDER BY doc_id", [ns]).fetchall()]
        return self._merge_nodes("Document", ns, rows, token)

    def _chunks(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"doc_id": r[1], "title": r[2], "position": r[3], "section": r[4], "page": r[5],
                                       "text": r[6], "content_hash": r[7], "n_tokens": r[8]}}
                for r in con.execute("SELECT chunk_id, doc_id, title, position, section, page, text, content_hash, n_tokens "
                                     "FROM chunks WHERE namespace = ? ORDER BY chunk_id", [ns]).fetchall()]
        out = self._merge_nodes("Chunk", ns, rows, token)
        out.update(self._merge_rels("PART_OF", "Chunk", "Document", ns,
                                    [{"s": r["id"], "t": r["props"]["doc_id"], "props": {"position": r["props"]["position"]}}
                                     for r in rows], token))
        return out

    def _entities(self, con, ns, token) -> dict:
        """Entities with their relations and mentions (the `entity_graph_tables` multi-asset)."""
        rows = [{"id": r[0], "props": {"name": r[1], "norm_name": r[2], "type": r[3], "description": r[4],
                                       "mention_count": r[5], "degree": r[6]}}
                for r in con.execute("SELECT entity_id, name, norm_name, type, description, mention_count, degree "
                                     "FROM entities WHERE namespace = ? ORDER BY entity_id", [ns]).fetchall()]
        out = self._merge_nodes("Entity", ns, rows, token)
        rel_rows = [{"s": r[0], "t": r[1], "props": {"id": r[2], "weight": r[3], "description": r[4], "n_chunks": r[5]}}
                    for r in con.execute("SELECT source_id, target_id, relation_id, weight, description, n_chunks "
                                         "FROM relations WHERE namespace = ? ORDER BY relation_id", [ns]).fetchall()]
        out.update(self._merge_rels("RELATED_TO", "Entity", "Entity", ns, rel_rows, token))
        # is_title: the chunk's document title names the entity (same normalization as the entity ids)
        men_rows = [{"s": r[0], "t": r[1], "props": {"count": r[2], "is_title": bool(r[3])}}
                    for r in con.execute("""
                        SELECT m.chunk_id, m.entity_id, m.count,
                               coalesce(e.norm_name = lh_norm(c.title)
                                        OR e.norm_name = lh_norm(regexp_replace(c.title, '^(?i)(the|a|an)\\s+', '')), false)
                        FROM mentions m
                        LEFT JOIN chunks c ON c.namespace = m.namespace AND c.chunk_id = m.chunk_id
                        LEFT JOIN entities e ON e.namespace = m.namespace AND e.entity_id = m.entity_id
                        WHERE m.namespace = ? ORDER BY m.chunk_id, m.entity_id""", [ns]).fetchall()]
        out.update(self._merge_rels("MENTIONS", "Chunk", "Entity", ns, men_rows, token))
        return out

    def _knn_edges(self, con, ns, token) -> dict:
        """The entity text embeddings and the SEMANTICALLY_SIMILAR edges, as the warehouse holds them."""
        ids, vectors = read_vectors(con, ns, "entity")
        vec_rows = [{"id": i, "v": [float(x) for x in v]} for i, v in zip(ids, np.asarray(vectors, dtype=np.float32))]
        out = {"embeddings_written": self._set_on_entities(ns, "e.embedding = row.v", vec_rows, "e.embedding")}
        rows = [{"s": r[0], "t": r[1], "props": {"score": r[2], "rank": r[3]}}
                for r in con.execute("SELECT source_id, target_id, score, rank FROM knn_edges WHERE namespace = ? "
                                     "ORDER BY source_id, target_id", [ns]).fetchall()]
        out.update(self._merge_rels("SEMANTICALLY_SIMILAR", "Entity", "Entity", ns, rows, token))
        return out

    def _communities(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "props": {"level": r[1], "size": r[2], "modularity": r[3], "parent_id": r[4]}}
                for r in con.execute("SELECT community_id, level, size, modularity, parent_id FROM communities "
                                     "WHERE namespace = ? ORDER BY community_id", [ns]).fetchall()]
        out = self._merge_nodes("Community", ns, rows, token)
        # the levels: a community BELONGS_TO the community of the level above that holds it
        parents = self._merge_rels("BELONGS_TO", "Community", "Community", ns,
                                   [{"s": r["id"], "t": r["props"]["parent_id"], "props": {}} for r in rows
                                    if r["props"]["parent_id"] is not None], token)
        out.update({f"community_{k}": v for k, v in parents.items()})
        scores = [{"id": r[0], "c": r[1], "pr": r[2]} for r in con.execute(
            "SELECT entity_id, community_id, pagerank FROM entity_scores WHERE namespace = ? ORDER BY entity_id", [ns]).fetchall()]
        out["scored_entities"] = self._set_on_entities(ns, "e.community_id = row.c, e.pagerank = row.pr", scores,
                                                       "e.community_id, e.pagerank")
        out.update(self._merge_rels("BELONGS_TO", "Entity", "Community", ns,
                                    [{"s": s["id"], "t": s["c"], "props": {}} for s in scores], token))
        return out

    def _summaries(self, con, ns, token) -> dict:
        rows = [{"id": r[0], "title": r[1], "summary": r[2], "hubs": list(r[3] or [])} for r in con.execute(
            "SELECT community_id, title, summary, hub_entities FROM community_summaries WHERE namespace = ? "
            "ORDER BY community_id", [ns]).fetchall()]
        n = self.client.write_batches("UNWIND $rows AS row MATCH (c:Community {namespace: $ns, id: row.id}) "
                                      "SET c.title = row.title, c.summary = row.summary, c.hub_entities = row.hubs "
                                      "RETURN count(c) AS n", rows, {"ns": ns})
        self.client.query("MATCH (c:Community {namespace: $ns}) WHERE NOT c.id IN $ids "
                          "REMOVE c.title, c.summary, c.hub_entities", {"ns": ns, "ids": [r["id"] for r in rows]}, write=True)
        return {"summaries": n, "summaries_missing_community": len(rows) - n}
