"""Load one namespace of the warehouse into an in-memory `GraphIndex`, once per (db, namespace, mtime).

Everything a query touches lives in numpy / scipy.sparse / bm25s structures, so a query never goes
back to DuckDB: vectors as row-aligned float32 matrices, the entity+passage graph as CSR, id maps as
dicts. The index is grouped into typed parts (chunks, entities, mentions, facts, communities, graph,
lexical), each built once with everything derived from it, and never changed afterwards: a served
index is shared by concurrent queries without locks. The cache is per process and keyed by the
database file's path, namespace, modification time and the graph edge weights; a re-index changes
the mtime and the next query reloads. A built index of a published snapshot is also kept on disk beside it
(`published/.index-cache/`, one file per namespace, snapshot version and graph parameters), so a new process (each
`lazyhippo query`) reads it in a fraction of the time building takes; that file holds what building derives (the
graph, BM25, the nearest-neighbour bounds, id maps), not what the snapshot stores (vectors, texts), which a load
reads from the snapshot.
"""

from __future__ import annotations

import hashlib
import math
import mmap
import os
import pickle
import re
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import scipy.sparse as sp

from lazyhippo.graph import ppr
from lazyhippo.graph.algorithms import positions
from lazyhippo.graph.names import norm_keys
from lazyhippo.graph.passage import EntityEdges, GraphParams, passage_adjacency
from lazyhippo.graph.ppr import parallel_matvec
from lazyhippo.query.nearest import Clusters, CosineBound, Int8Rows
from lazyhippo.query.packing import Ascending, DocRows, KeyRows, Rows, Spans, Texts, unpacked
from lazyhippo.query.text import norm_key, tokens
from lazyhippo.settings import Settings

if TYPE_CHECKING:  # bm25s and pyarrow are imported when an index is built, not with the query package
    from lazyhippo.query.lexical import Lexical


@dataclass(frozen=True)
class Chunks:
    """Passages; row order = chunk index."""

    ids: "Texts"
    pos: "Rows"
    doc_ids: list[str]
    titles: list[str]
    sections: list[str | None]
    pages: list[int | None]
    positions: np.ndarray
    texts: "Texts"
    content_hashes: "Texts"
    n_tokens: np.ndarray
    sources: list[str]
    vecs: Int8Rows                    # (n_chunks, dim), zero rows where a chunk has no vector
    title_index: KeyRows              # norm_key(document title) -> chunk indices
    doc_pos: Mapping[tuple[str, int], int]  # (doc_id, position) -> chunk index, for neighbours
    near: Clusters | None = None      # from `APPROX_MIN_ROWS` chunks: the question's passages by clusters


@dataclass(frozen=True)
class Entities:
    ids: "Texts"
    pos: "Rows"
    names: "Texts"
    types: list[str]
    vecs: Int8Rows
    df: np.ndarray                    # passages mentioning each entity
    idf: np.ndarray
    name_index: KeyRows               # norm_key(name) -> entity indices
    pagerank: np.ndarray
    near: CosineBound                 # which entities a query phrase's embedding link can reach


@dataclass(frozen=True)
class Mentions:
    """Which passage names which entity, and each passage's title entity."""

    counts: sp.csr_matrix             # (n_chunks, n_entities) mention counts
    title_entity: np.ndarray          # chunk index -> entity index of its title (-1 if none)
    title_base_entity: np.ndarray     # chunk index -> entity of the title without a "(...)" qualifier (-1 if none)


@dataclass(frozen=True)
class Facts:
    """Entity-bearing sentences (HippoRAG 2's triples)."""

    ids: "Texts"                      # a query reads none: packed, not a million Python strings
    chunk: np.ndarray
    texts: "Spans"                    # each a sentence of its passage's text
    entities: sp.csr_matrix           # (n_facts, n_entities) 0/1
    by_entity: sp.csr_matrix          # (n_entities, n_facts): the transpose, for "facts naming e"
    vecs: Int8Rows
    lexical: Lexical                  # BM25 over the fact texts
    near: CosineBound                 # which facts can rank among a question's best


@dataclass(frozen=True)
class Communities:
    ids: list[str]
    titles: list[str]
    summaries: list[str]
    hubs: list[list[str]]
    vecs: Int8Rows
    members: list[np.ndarray]         # entity indices per community
    tokens: list[set[str]]
    coverage: sp.csc_matrix           # (n_chunks, n_communities): member entities each chunk mentions (sorted,
                                      # no zeros); sparse: a chunk names few communities' members (dense: 110 MB
                                      # at 100,000 documents)
    levels: np.ndarray                # level of each community (0: coarsest)


@dataclass(frozen=True)
class Graph:
    """Entity+passage graph: nodes 0..n_entities-1 are entities, then chunks. The adjacency is symmetric, so its
    CSR structure is also that of the transition by rows and by columns: the two share one copy of it. The walks
    read only the transitions, so the float64 adjacency is held as the triangle the disk cache stores (2.3-3.6
    bytes an entry at 10,000-50,000 documents against 8)."""

    adjacency: "_Triangle | sp.csr_matrix"  # `adjacency_matrix()` rebuilds it to the bit
    dangling: np.ndarray
    node_ids: "NodeIds"
    node_pos: "NodePositions"
    params: GraphParams
    transition32: sp.csr_matrix | None  # column-stochastic, float32: half the memory traffic of float64; None
                                      # from `PUSH_MIN_EDGES` entries on, where the walk reads only the columns
    matvec32: Callable | None         # row-blocked parallel product of transition32 (None: plain product)
    columns32: sp.csc_matrix          # transition32 by column: a sparse vector's product reads its columns only
    degree: np.ndarray                # weighted degree per node (adjacency row sums; the graph is symmetric)

    @property
    def edges(self) -> int:
        """Entries of the adjacency (each edge both ways)."""
        return int(self.columns32.nnz)

    def adjacency_matrix(self) -> sp.csr_matrix:
        return _matrix(self.adjacency)


@dataclass(frozen=True)
class GraphIndex:
    namespace: str
    db_path: str
    loaded_at: float
    load_seconds: float
    dim: int                          # of entity, fact and community vectors (chunk vectors: chunks.vecs)
    embedding_model: str | None       # of the chunk vectors
    chunks: Chunks
    entities: Entities
    mentions: Mentions
    facts: Facts
    communities: Communities
    graph: Graph
    lexical: Lexical
    longest_name: int                 # words of the longest entity name or title: no longer question span can match
    stats: dict = field(default_factory=dict)

    @property
    def n_chunks(self) -> int:
        return len(self.chunks.ids)

    @property
    def n_entities(self) -> int:
        return len(self.entities.ids)

    def chunk_node(self, c: int) -> int:
        return self.n_entities + c

    # the node surface a PPR backend needs (Neo4j maps its scores back through these)
    @property
    def node_ids(self) -> "NodeIds":
        return self.graph.node_ids

    @property
    def node_pos(self) -> "NodePositions":
        return self.graph.node_pos


@dataclass(frozen=True, eq=False)
class NodeIds(Sequence):
    """The graph's node ids, the entities' then the chunks', read through the parts' own ids: a list of them
    all was a million more pointers in memory and 25 MB of the disk cache at 100,000 documents."""

    entities: Sequence[str]
    chunks: Sequence[str]

    def __len__(self) -> int:
        return len(self.entities) + len(self.chunks)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n_e = len(self.entities)
        i = i + len(self) if i < 0 else i
        return self.entities[i] if i < n_e else self.chunks[i - n_e]

    def __eq__(self, other) -> bool:
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))


@dataclass(frozen=True, eq=False)
class NodePositions(Mapping):
    """Node id -> node index, read through the entities' and chunks' own maps (a dict of every node was 100 MB
    at 100,000 documents)."""

    entities: Mapping[str, int]
    chunks: Mapping[str, int]

    def __getitem__(self, key: str) -> int:
        c = self.chunks.get(key)
        return self.entities[key] if c is None else len(self.entities) + c

    def __iter__(self):
        return chain(self.entities, self.chunks)

    def __len__(self) -> int:
        return len(self.entities) + len(self.chunks)

    @property
    def graph_params(self) -> GraphParams:
        return self.graph.params


def _table(con, sql: str, params: dict):
    return con.sql(sql, params=params).to_arrow_table()


def _pydict(con, sql: str, params: dict, texts: tuple[str, ...] = ()) -> dict:
    """The columns of a query as Python lists, and the columns `texts` as `Texts`, read by batches: `to_pydict`
    of the whole table held the table in Arrow beside its lists (the passage texts twice)."""
    reader = con.sql(sql, params=params).to_arrow_reader(_BATCH_ROWS)
    out: dict = {name: [] for name in reader.schema.names}
    for batch in reader:
        for name, column in zip(batch.schema.names, batch.columns):
            out[name].append(column) if name in texts else out[name].extend(column.to_pylist())
    for name in texts:
        out[name] = Texts.of_arrow(out[name])
    return out


def _strings(x):
    """An Arrow string array of ids or names, a `Texts` one over its own buffers; a list packed first, since
    `pa.array` of Python objects imports pandas (pyarrow's check for its types), which a query never needs."""
    import pyarrow as pa

    texts = x if isinstance(x, Texts) else Texts.of_bytes([s.encode() for s in x])
    return texts.arrow().cast(pa.string())


def _vectors(con, ns: str, kind: str, ids: Sequence[str]) -> tuple[Int8Rows, str | None]:
    """The vectors of `kind` as rows aligned with `ids` (zero rows for items without one), in their stored int8 form.
    Read by small batches into the rows: the whole table in Arrow and its rows picked out of it were two more
    copies (560 MB for a million facts), and DuckDB's and Arrow's working memory grows with the batch (at 10,000
    documents the entities' read held +137 MB at once by batches of 65,536 rows, +91 MB by 8,192)."""
    import pyarrow as pa

    from lazyhippo.stores.warehouse import VECTOR_COLUMNS, stored_rows

    reader = con.sql(f"SELECT item_id, model, {VECTOR_COLUMNS} FROM embeddings WHERE namespace = $ns AND kind = $kind",
                     params={"ns": ns, "kind": kind}).to_arrow_reader(_VECTOR_BATCH_ROWS)
    keys, out, model = _strings(ids), None, None
    for batch in reader:
        if not batch.num_rows:
            continue
        q, scale = stored_rows(pa.Table.from_batches([batch]))
        if out is None:
            out, model = Int8Rows.zeros(len(ids), q.shape[1]), batch.column("model")[0].as_py()
        rows = _found(batch.column("item_id"), keys)
        keep = rows >= 0
        out.q[rows[keep]] = q[keep]
        out.scale[rows[keep]] = scale[keep]
    return (out, model) if out is not None else (Int8Rows.zeros(len(ids), 0), None)


def _found(names, keys) -> np.ndarray:
    """The row of each of the Arrow strings `names` in the Arrow strings `keys` (`_strings`), -1 where absent:
    `keys` made once for a whole table read by batches."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from lazyhippo.stores.warehouse import numbers

    return numbers(pc.index_in(names.cast(pa.string()), value_set=keys), np.int32, null=-1).astype(np.int64)


_BATCH_ROWS = 65_536  # rows read from DuckDB at once where a whole table's Arrow copy is not needed
_VECTOR_BATCH_ROWS = 8_192  # vectors read at once: 2 MB of int8 at 256 dimensions
_TEXT_BATCH_ROWS = 8_192  # texts read at once: ~6 MB of passages


def _graph_dim(con, ns: dict) -> int:
    """Dimension of the entity vectors (a profile may embed passages with another model than the graph)."""
    from lazyhippo.stores.warehouse import vector_length_sql

    dims = _table(con, f"SELECT {vector_length_sql(con)} FROM embeddings WHERE namespace = $ns AND kind = 'entity' LIMIT 1",
                  ns)
    return int(dims.column(0)[0].as_py()) if dims.num_rows else 0


def _fit_dim(mat: Int8Rows, dim: int) -> Int8Rows:
    return mat if mat.shape[1] == dim else Int8Rows.zeros(len(mat), dim)


def _index_of(keys) -> KeyRows:
    """norm_key(key) -> indices of the rows carrying it, in row order (empty keys and nulls left out)."""
    encoded = norm_keys(_strings(keys)).dictionary_encode()
    return KeyRows.of(encoded.dictionary, encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False))


def _chunks(con, ns: dict) -> tuple[Chunks, str | None]:
    """The passages in document order; their texts are not part of the sort but read after it into their rows
    (`_placed_texts`): sorted with the rest, DuckDB's sort and the Arrow batches held them twice more (at 50,000
    documents the read peaked at 560 MB over what it keeps, for 102 MB of text)."""
    from lazyhippo.stores.warehouse import release_cache

    ch = _pydict(con, """
        SELECT c.chunk_id, c.doc_id, c.title, c.section, c.page, c.position, coalesce(strlen(c.text), 0) AS size,
               c.content_hash, c.n_tokens, coalesce(d.source, c.doc_id) AS source
        FROM chunks c LEFT JOIN documents d ON d.namespace = c.namespace AND d.doc_id = c.doc_id
        WHERE c.namespace = $ns ORDER BY c.doc_id, c.position""", ns, texts=("chunk_id", "content_hash"))
    ids = ch["chunk_id"]
    release_cache(con)  # the sort's blocks, before the texts' read
    texts = _placed_texts(con, "SELECT chunk_id, text FROM chunks WHERE namespace = $ns", ns, ids, ch["size"])
    release_cache(con)
    pos = Rows.of(ids)
    vecs, model = _vectors(con, ns["ns"], "chunk", ids)
    positions = np.asarray(ch["position"], dtype=np.int64)
    doc_ids = _shared(ch["doc_id"])  # a document's id, title, section and source once, not once per passage
    return Chunks(ids=ids, pos=pos, doc_ids=doc_ids, titles=_shared([t or "" for t in ch["title"]]),
                  sections=_shared(ch["section"]), pages=ch["page"], positions=positions, texts=texts,
                  content_hashes=ch["content_hash"], n_tokens=np.asarray(ch["n_tokens"], dtype=np.int64),
                  sources=_shared(ch["source"]), vecs=vecs, title_index=_index_of(ch["title"]),
                  doc_pos=_doc_positions(doc_ids, positions), near=Clusters.of_large(vecs)), model


def _placed_texts(con, sql: str, params: dict, keys: Texts, sizes: Sequence[int]) -> Texts:
    """The texts of a query of (key, text) rows in any order, each put at the row of its key in `keys`, whose
    texts are `sizes` bytes long: one buffer of their final size filled batch by batch, so the read holds the
    texts once and a batch. A run of rows that keeps its order in `keys` is copied at once."""
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=offsets[1:])
    data = np.zeros(int(offsets[-1]), dtype=np.uint8)
    arrow_keys = _strings(keys)
    for batch in con.sql(sql, params=params).to_arrow_reader(_TEXT_BATCH_ROWS):
        if not batch.num_rows:
            continue
        rows, texts = _found(batch.column(0), arrow_keys), Texts.of_arrow([batch.column(1)])
        cuts = np.flatnonzero((np.diff(rows) != 1) | (rows[:-1] < 0)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(rows)]):
            if rows[a] >= 0:  # a run's bytes land where its first row begins and must end where its last one ends
                data[offsets[rows[a]]:offsets[rows[b - 1] + 1]] = texts.data[texts.offsets[a]:texts.offsets[b]]
    return Texts(data, offsets)


def _mention_counts(con, ns: dict, chunk_ids: Texts, entity_ids: Texts) -> sp.csr_matrix:
    mt = _table(con, "SELECT chunk_id, entity_id, count FROM mentions WHERE namespace = $ns", ns)
    rows, cols = (positions(_strings(ids), mt.column(key)) for ids, key in ((chunk_ids, "chunk_id"), (entity_ids, "entity_id")))
    keep = (rows >= 0) & (cols >= 0)
    vals = mt.column("count").to_numpy().astype(np.float32)[keep]
    return sp.csr_matrix((vals, (rows[keep], cols[keep])), shape=(len(chunk_ids), len(entity_ids)), dtype=np.float32)


def _entities(con, ns: dict, en: dict, counts: sp.csr_matrix, scores, dim: int) -> Entities:
    ids = en["entity_id"]
    pos = Rows.of(ids)
    df, idf = _entity_df(counts)
    pagerank = np.zeros(len(ids))
    rows = positions(_strings(ids), scores.column("entity_id"))
    keep = rows >= 0
    pagerank[rows[keep]] = scores.column("pagerank").to_numpy()[keep]
    vecs, _ = _vectors(con, ns["ns"], "entity", ids)
    vecs = _fit_dim(vecs, dim)
    return Entities(ids=ids, pos=pos, names=en["name"], types=_shared([t or "" for t in en["type"]]), vecs=vecs,
                    df=df, idf=idf, name_index=_index_of(en["name"]), pagerank=pagerank,
                    # a link needs a cosine of 0.8: on 64 of 256 axes a phrase reads ~5 of 2Wiki's 37k in full
                    near=CosineBound.of(vecs, 64))


def _entity_df(counts: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray]:
    """How many passages mention each entity, and the idf that follows."""
    n_p = counts.shape[0]
    df = np.asarray((counts > 0).sum(axis=0)).ravel().astype(np.float64)
    return df, np.log((n_p + 1.0) / (df + 1.0)) + 1.0 / max(math.log(n_p + 2.0), 1.0)


def _positions(ids: list) -> dict:
    """Id -> row: the inversion of a list of ids (the last row of an id given twice)."""
    return dict(zip(ids, range(len(ids))))


def _doc_positions(doc_ids: list[str], positions: np.ndarray) -> Mapping[tuple[str, int], int]:
    return DocRows.of(doc_ids, positions) or _positions(list(zip(doc_ids, positions.tolist())))


def _mentions(counts: sp.csr_matrix, chunks: Chunks, entities: Entities) -> Mentions:
    n_p = len(chunks.ids)
    title_entity = np.full(n_p, -1, dtype=np.int64)
    title_base_entity = np.full(n_p, -1, dtype=np.int64)
    names = entities.name_index
    for i, title in enumerate(chunks.titles):
        if not norm_key(title):
            continue
        cands = _named(names, title)
        if cands is not None:
            title_entity[i] = cands[0]
        base = _QUALIFIER.sub("", title).strip()
        if base and base != title:
            cands = _named(names, base)
            if cands is not None and cands[0] != title_entity[i]:
                title_base_entity[i] = cands[0]
    return Mentions(counts=counts, title_entity=title_entity, title_base_entity=title_base_entity)


def _facts(con, ns: dict, chunks: Chunks, entity_ids: Texts, dim: int) -> Facts:
    """Read by batches, entity lists flattened in Arrow: no loop over a million facts and their entity lists, and
    never the whole table in Arrow (its entity id lists and their flattened copy: +83 MB at 10,000 documents)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from lazyhippo.query.lexical import Lexical
    from lazyhippo.stores.warehouse import SPANS, release_cache, stored_columns

    # each text as the warehouse places it in its chunk's text (a snapshot written before spans: every one whole)
    spanned = set(SPANS) <= set(stored_columns(con, "facts"))
    placed = ("coalesce(span_start, -1) AS span_start, coalesce(span_length, 0) AS span_length" if spanned
              else "-1 AS span_start, 0 AS span_length")
    reader = con.sql(f"SELECT fact_id, chunk_id, {placed}, text, entity_ids FROM facts WHERE namespace = $ns "
                     "ORDER BY fact_id", params=ns).to_arrow_reader(_BATCH_ROWS)
    chunk_keys, entity_keys = _strings(chunks.ids), _strings(entity_ids)
    fact_ids, spans, chunk, rows, cols, n = [], [], [], [], [], 0
    for batch in reader:
        at = _found(batch.column("chunk_id"), chunk_keys)
        batch = batch.filter(pa.array(at >= 0))
        chunk.append(at[at >= 0])
        fact_ids.append(batch.column("fact_id"))
        spans.append(Spans.placed(chunks.texts, chunk[-1], *(batch.column(c).to_numpy(zero_copy_only=False)
                                                             for c in ("span_start", "span_length")),
                                  batch.column("text").to_pylist()))
        named = batch.column("entity_ids")
        entity = _found(pc.list_flatten(named), entity_keys)
        fact = pc.list_parent_indices(named).to_numpy().astype(np.int64) + n
        rows.append(fact[entity >= 0])
        cols.append(entity[entity >= 0])
        n += batch.num_rows
    del reader, chunk_keys, entity_keys
    release_cache(con)  # the sort's and scan's blocks (~100 MB at 10,000 documents), before the vectors' read
    ids, texts = Texts.of_arrow(fact_ids), Spans.joined(spans)
    del fact_ids, spans
    chunk, rows, cols = (np.concatenate(x) if x else np.zeros(0, dtype=np.int64) for x in (chunk, rows, cols))
    entities = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(len(ids), len(entity_ids)))
    del rows, cols
    entities.sum_duplicates()
    entities.data[:] = 1.0  # an entity named twice in a fact counts once
    vecs, _ = _vectors(con, ns["ns"], "fact", ids)
    vecs = _fit_dim(vecs, dim)
    release_cache(con)
    return Facts(ids=ids, chunk=chunk, texts=texts, entities=entities, by_entity=entities.T.tocsr(), vecs=vecs,
                 # ranking the best 6 of close scores takes a tighter bound than a threshold: on 128 axes a
                 # question reads ~130 of 2Wiki's 21k in full (1.1 against 1.9 ms)
                 near=CosineBound.of(vecs, 128),
                 # words by the passage title too: a sentence that opens "She ..." still matches its subject's name
                 lexical=Lexical.build(_Titled([chunks.titles[c] for c in chunk.tolist()], texts)))


@dataclass(frozen=True, eq=False)
class _Titled(Sequence):
    """Each text after its title on a line of its own, as BM25 reads them, made one at a time when read: the
    list of them all was another copy of every passage and fact text (400 MB at 100,000 documents)."""

    titles: Sequence[str]
    texts: Sequence[str]

    def __len__(self) -> int:
        return len(self.texts)

    def __getitem__(self, i: int) -> str:
        return f"{self.titles[i]}\n{self.texts[i]}"

    def __iter__(self):
        return (f"{t}\n{x}" for t, x in zip(self.titles, self.texts))


def _communities(con, ns: dict, counts: sp.csr_matrix, dim: int) -> Communities:
    from lazyhippo.stores.warehouse import release_cache

    cs = _table(con, "SELECT s.community_id, s.title, s.summary, s.hub_entities, coalesce(c.level, 0) AS level "
                     "FROM community_summaries s LEFT JOIN communities c USING (namespace, community_id) "
                     "WHERE s.namespace = $ns ORDER BY s.community_id", ns).to_pydict()
    ids = cs["community_id"]
    vecs, _ = _vectors(con, ns["ns"], "community", ids)
    members = _members(con, ns, len(ids))
    release_cache(con)  # the members' joins and sort: ~130 MB at 10,000 documents, held into the graph's build
    return Communities(ids=ids, titles=cs["title"], summaries=cs["summary"], hubs=[list(h or []) for h in cs["hub_entities"]],
                       vecs=_fit_dim(vecs, dim), members=members,
                       tokens=[set(tokens(f"{t} {s} {' '.join(h or [])}")) for t, s, h in
                               zip(cs["title"], cs["summary"], cs["hub_entities"])],
                       coverage=_coverage(counts, members), levels=np.asarray(cs["level"], dtype=np.int64))


def _members(con, ns: dict, n_communities: int) -> list[np.ndarray]:
    """The entity positions of each community (ordered by community id), at every level (an entity is in its
    community and their ancestors), by name within one. Positions are the ranks of the ids, as the parts order
    them. DuckDB gives integers only (each entity's finest community and rank by name, each community's parent and
    summary); a community's members are the finest communities' under it, merged by name: the recursive query over
    the id strings, joined and sorted by name in DuckDB, held +96-107 MB at 10,000 documents (now +45-54), the
    build's peak, and every (community, entity) pair at once beside the result."""
    # every community and parent named, by the rank of its id
    ranks = """k AS (SELECT community_id, row_number() OVER (ORDER BY community_id) - 1 AS pos FROM (
                   SELECT community_id FROM communities WHERE namespace = $ns UNION
                   SELECT parent_id FROM communities WHERE namespace = $ns AND parent_id IS NOT NULL))"""
    tree = con.execute(f"""
        WITH {ranks},
             s AS (SELECT community_id, row_number() OVER (ORDER BY community_id) - 1 AS pos
                   FROM community_summaries WHERE namespace = $ns)
        SELECT coalesce(p.pos, -1)::BIGINT AS parent, coalesce(s.pos, -1)::BIGINT AS summary FROM k
        LEFT JOIN communities c ON c.namespace = $ns AND c.community_id = k.community_id
        LEFT JOIN k p ON p.community_id = c.parent_id LEFT JOIN s ON s.community_id = k.community_id
        ORDER BY k.pos""", ns).fetchnumpy()
    scored = con.execute(f"""
        WITH {ranks},
             e AS (SELECT entity_id, row_number() OVER (ORDER BY entity_id) - 1 AS pos,
                          row_number() OVER (ORDER BY name, entity_id) - 1 AS by_name
                   FROM entities WHERE namespace = $ns)
        SELECT k.pos::BIGINT AS community, e.pos::BIGINT AS entity, e.by_name::BIGINT AS by_name
        FROM entity_scores s JOIN e USING (entity_id) JOIN k USING (community_id)
        JOIN communities c ON c.namespace = $ns AND c.community_id = s.community_id
        WHERE s.namespace = $ns""", ns).fetchnumpy()
    parent, summary = (np.asarray(tree[k], dtype=np.int64) for k in ("parent", "summary"))
    finest, entity, by_name = (np.asarray(scored[k], dtype=np.int64) for k in ("community", "entity", "by_name"))
    rows = np.lexsort((by_name, finest))  # by finest community, by name within one
    bounds = np.concatenate([[0], np.cumsum(np.bincount(finest, minlength=len(parent)))])
    below: list[list[int]] = [[] for _ in range(n_communities)]  # the finest communities under each summarized one
    for k in np.flatnonzero(np.diff(bounds)).tolist():
        c = k
        for _ in range(len(parent)):  # a chain of ancestors visits each community at most once
            if summary[c] >= 0:
                below[summary[c]].append(k)
            c = parent[c]
            if c < 0:
                break
    members = []
    for ks in below:
        at = np.concatenate([rows[bounds[k]:bounds[k + 1]] for k in ks]) if ks else rows[:0]
        members.append(entity[at[np.argsort(by_name[at])] if len(ks) > 1 else at])
    return members


def _coverage(counts: sp.csr_matrix, members: list[np.ndarray]) -> sp.csc_matrix:
    """(n_chunks, n_communities): how many of each community's entities each chunk mentions, by community (the
    global route reads a community's chunks)."""
    rows = np.concatenate(members) if members else np.zeros(0, dtype=np.int64)
    cols = np.repeat(np.arange(len(members)), [len(m) for m in members])
    e2c = sp.csr_matrix((np.ones(len(rows), dtype=np.float32), (rows, cols)), shape=(counts.shape[1], len(members)))
    coverage = sp.csc_matrix((counts > 0).astype(np.float32) @ e2c)
    coverage.eliminate_zeros()
    coverage.sort_indices()
    return coverage


def _graph(con, ns: dict, params: GraphParams, chunks: Chunks, entities: Entities, mentions: Mentions) -> Graph:
    n_e, n_p = len(entities.ids), len(chunks.ids)
    entity_pos = entities.pos
    synonyms = _entity_edges(con, ns, "knn_edges", "score")  # the smaller first: only it is held over the other's read
    relations = _entity_edges(con, ns, "relations", "weight")
    mc = mentions.counts.tocoo()
    adjacency = passage_adjacency(params, n_e, n_p, entities.types, relations, synonyms, mc,
                                  mentions.title_entity[mc.row] == mc.col)
    del relations, synonyms, mc  # the edges' columns (16 bytes a relation) before the triangle's arrays
    adjacency.sort_indices()
    triangle = _Triangle.of(adjacency)  # before the transitions: its blocks' scratch is not beside their values
    t32, columns32, degree = _transitions(adjacency)
    del adjacency
    return Graph(adjacency=triangle, dangling=degree <= 0,
                 node_ids=NodeIds(entities.ids, chunks.ids), node_pos=NodePositions(entity_pos, chunks.pos), params=params,
                 transition32=t32, matvec32=_matvec(t32), columns32=columns32, degree=degree)


def _entity_edges(con, ns: dict, table: str, weight: str) -> EntityEdges:
    """The edges of `table` over entity positions (the rank of the id, as `entities.ids` is ordered), joined in
    DuckDB: 13.7M relations read as two columns of ids took 3 GB of Arrow strings to look up. In the table's own
    order, as `passage_adjacency` sums duplicates in the order it meets them, put so by a numpy sort of the row
    ids: DuckDB's ORDER BY held 120 MB more at 50,000 documents (6.6M relations) and took longer; edges to no
    entity are left out. Joined a slice of the table's rows at a time into the arrays, the blocks DuckDB cached
    for a slice released before the next: the whole join's result beside its numpy copy and the table's cached
    blocks took 430 MB at once at 50,000 documents, by 1M rows 290."""
    from lazyhippo.stores.warehouse import release_cache

    lo, hi, n = con.execute(f"SELECT min(rowid), max(rowid), count(*) FROM {table} WHERE namespace = $ns",
                            ns).fetchall()[0]
    out = {"source": np.empty(n, dtype=np.int32), "target": np.empty(n, dtype=np.int32), "weight": np.empty(n)}
    done = 0
    for first in range(lo or 0, (hi or -1) + 1, _EDGE_BATCH_ROWS):
        rows = con.execute(f"""
            WITH e AS (SELECT entity_id, row_number() OVER (ORDER BY entity_id) - 1 AS pos
                       FROM entities WHERE namespace = $ns)
            SELECT r.rowid AS at, s.pos::INTEGER AS source, t.pos::INTEGER AS target,
                   coalesce({weight}::DOUBLE, 'NaN'::DOUBLE) AS weight
            FROM {table} r JOIN e s ON s.entity_id = r.source_id JOIN e t ON t.entity_id = r.target_id
            WHERE r.namespace = $ns AND r.rowid BETWEEN $first AND $last""",
                           {**ns, "first": first, "last": first + _EDGE_BATCH_ROWS - 1}).fetchnumpy()
        order = np.argsort(np.asarray(rows.pop("at")), kind="stable")
        for c, column in out.items():
            column[done:done + len(order)] = np.asarray(rows.pop(c))[order]
        done += len(order)
        release_cache(con)
    return EntityEdges(*(column[:done] for column in out.values()))


_EDGE_BATCH_ROWS = 1 << 20  # rows of an edge table joined at once


def _transitions(adjacency: sp.csr_matrix) -> tuple[sp.csr_matrix | None, sp.csc_matrix, np.ndarray]:
    """The walk's column-stochastic transition (`transition_matrix`, to the same float32 values) by rows and by
    columns, and the weighted degrees; by rows only below `PUSH_MIN_EDGES` entries, as a larger graph's walk
    (forward push) reads only the columns (4 bytes an entry: 150 MB at 100,000 documents). Made from the
    adjacency's arrays directly: the transpose of A scaled by 1 / degree per row is, in CSC form, A's own CSR
    structure, so only the by-rows form needs a conversion
    (0.05-0.3 s at 2.6M edges against 0.6 s: a cached index pays it on every load). Where that form has the
    adjacency's structure (a symmetric graph), the three share one copy of it."""
    a = adjacency if sp.isspmatrix_csr(adjacency) and adjacency.dtype == np.float64 \
        else sp.csr_matrix(adjacency, dtype=np.float64)
    a.sort_indices()  # (in place: the same matrix) the column form's indices are its rows'
    degree = np.asarray(a.sum(axis=1)).ravel()
    inv = np.zeros_like(degree)
    inv[degree > 0] = 1.0 / degree[degree > 0]
    columns32 = sp.csc_matrix((_scaled32(a, inv), a.indices, a.indptr), shape=a.shape[::-1])
    if a.nnz >= ppr.PUSH_MIN_EDGES:
        columns32.indptr, columns32.indices = a.indptr, a.indices
        return None, columns32, degree
    t32 = columns32.tocsr()
    t32.sort_indices()
    for m in (t32, columns32):
        if np.array_equal(m.indptr, a.indptr) and np.array_equal(m.indices, a.indices):
            m.indptr, m.indices = a.indptr, a.indices
    return t32, columns32, degree


def _scaled32(a: sp.csr_matrix, inv: np.ndarray) -> np.ndarray:
    """Each entry of `a` times its row's `inv`, in float32, by blocks of rows: the float64 products of all the
    entries beside their float32 copy were 12 bytes an entry at once."""
    out = np.empty(a.nnz, dtype=np.float32)
    for r0, r1, s, e in _row_blocks(a.indptr, _SCALE_BLOCK):
        block = np.repeat(inv[r0:r1], np.diff(a.indptr[r0:r1 + 1]))
        block *= a.data[s:e]
        out[s:e] = block
    return out


_SCALE_BLOCK = 1 << 20  # entries scaled at once


def _matvec(t32: sp.csr_matrix | None) -> Callable | None:
    return None if t32 is None else parallel_matvec(t32)


def build_index(con, namespace: str, db_path: str, params: GraphParams) -> GraphIndex:
    from lazyhippo.query.lexical import Lexical

    from lazyhippo.stores.warehouse import release_cache

    t0 = time.perf_counter()
    ns = {"ns": namespace}
    chunks, model = _chunks(con, ns)
    dim = _graph_dim(con, ns) or chunks.vecs.shape[1]
    en = _pydict(con, "SELECT entity_id, name, type FROM entities WHERE namespace = $ns ORDER BY entity_id", ns,
                 texts=("entity_id", "name"))
    counts = _mention_counts(con, ns, chunks.ids, en["entity_id"])
    scores = _table(con, "SELECT entity_id, pagerank FROM entity_scores WHERE namespace = $ns", ns)
    entities = _entities(con, ns, en, counts, scores, dim)
    mentions = _mentions(counts, chunks, entities)
    # the table blocks DuckDB keeps cached after a part's reads go before the next part's arrays are made (here,
    # in `_facts` before BM25 and in `_graph` before the adjacency): at 10,000 documents a sixth of the build's peak
    release_cache(con)
    facts = _facts(con, ns, chunks, en["entity_id"], dim)
    communities = _communities(con, ns, counts, dim)
    graph = _graph(con, ns, params, chunks, entities, mentions)
    seconds = time.perf_counter() - t0
    stats = {"chunks": len(chunks.ids), "entities": len(entities.ids), "facts": len(facts.ids),
             "communities": len(communities.ids), "graph_nodes": len(graph.node_ids),
             "graph_edges": graph.edges, "load_seconds": round(seconds, 3)}
    return GraphIndex(namespace=namespace, db_path=db_path, loaded_at=time.time(), load_seconds=seconds, dim=dim,
                      embedding_model=model, chunks=chunks, entities=entities, mentions=mentions, facts=facts,
                      communities=communities, graph=graph,
                      lexical=Lexical.build(_Titled(chunks.titles, chunks.texts)),
                      longest_name=max((k.count(" ") + 1 for k in chain(entities.name_index, chunks.title_index) if k),
                                       default=0),
                      stats=stats)


_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")


def _named(names: dict[str, np.ndarray], title: str) -> np.ndarray | None:
    """Entities named like `title`, or like it without a leading article."""
    cands = names.get(norm_key(title))
    return cands if cands is not None else names.get(norm_key(_drop_article(title)))


def _drop_article(title: str) -> str:
    parts = title.split(maxsplit=1)
    return parts[1] if len(parts) == 2 and parts[0].lower() in ("the", "a", "an") else title


# ---------------------------------------------------------------- cache

_CACHE: "OrderedDict[tuple, GraphIndex]" = OrderedDict()
_LOCK = threading.Lock()
_MAX_CACHED = 4


def db_version(db_path: Path) -> tuple[int, int]:
    """Modification times of the warehouse file and its write-ahead log: changes whenever a run writes."""
    st = db_path.stat()
    wal = db_path.with_name(db_path.name + ".wal")
    return st.st_mtime_ns, (wal.stat().st_mtime_ns if wal.exists() else 0)


def load_index(settings: Settings, params: GraphParams | None = None) -> GraphIndex:
    """The cached GraphIndex of `settings`' namespace; built on first use and after the db file changes."""
    from lazyhippo.stores.warehouse import read_path

    params = params or GraphParams()
    db_path = read_path(settings)
    if db_path is None:
        raise FileNotFoundError(f"no complete index of namespace {settings.namespace!r} in {settings.home}: build an index first")
    key = (str(db_path), settings.namespace, db_version(db_path), params)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
        same_version = next((v for k, v in _CACHE.items() if k[:3] == key[:3]), None)
        idx = (_regraph(settings, same_version, params) if same_version is not None
               else _build(settings, str(db_path), params))
        stale = [k for k in _CACHE if k[:2] == key[:2] and k[2] != key[2]]  # older versions of this warehouse
        for k in stale:
            del _CACHE[k]
        _CACHE[key] = idx
        while len(_CACHE) > _MAX_CACHED:
            _CACHE.popitem(last=False)
        return idx


def _build(settings: Settings, db_path: str, params: GraphParams) -> GraphIndex:
    """Readers open the published snapshot, which no writer ever holds: no waiting needed. A snapshot's index
    is read from its disk cache when one was written for this version, else built and cached."""
    from lazyhippo.stores.warehouse import connect, snapshot_path

    cache = _disk_cache(Path(db_path), settings.namespace, params) if Path(db_path) == snapshot_path(settings) else None
    with connect(settings, read_only=True) as con:
        idx = _read_cached(cache, con) if cache is not None else None
        if idx is not None:
            return idx
        idx = build_index(con, settings.namespace, db_path, params)
    if cache is not None:
        _write_cached(cache, idx)
    return idx


def _regraph(settings: Settings, base: GraphIndex, params: GraphParams) -> GraphIndex:
    """`base` with its walk's graph built with other `params` (another KNN threshold, say): every other part
    (chunks, vectors, facts, communities) is shared, so only the edges are read again."""
    from lazyhippo.stores.warehouse import connect

    t0 = time.perf_counter()
    with connect(settings, read_only=True) as con:
        graph = _graph(con, {"ns": settings.namespace}, params, base.chunks, base.entities, base.mentions)
    return replace(base, graph=graph, loaded_at=time.time(), load_seconds=time.perf_counter() - t0,
                   stats={**base.stats, "graph_edges": graph.edges})


_CACHE_DIR = ".index-cache"
# the modules whose classes a cached index holds: a change to any of them makes older cache files unreadable
_CACHED_CODE = ("query/loader.py", "query/lexical.py", "query/nearest.py", "query/packing.py", "graph/passage.py", "graph/ppr.py")


def _disk_cache(db_path: Path, namespace: str, params: GraphParams) -> Path:
    """The cache file of this snapshot version (file identity, size, mtimes) and loader code, then graph
    parameters (a query with its own KNN threshold or hub weight gets its own file beside the default's)."""
    st = db_path.stat()
    root = Path(__file__).resolve().parents[1]
    version = hashlib.sha256(repr((st.st_ino, st.st_size, db_version(db_path))).encode())
    for name in _CACHED_CODE:
        version.update((root / name).read_bytes())
    graph = hashlib.sha256(repr(params).encode())
    return db_path.parent / _CACHE_DIR / f"{namespace}-{version.hexdigest()[:20]}-{graph.hexdigest()[:8]}.pickle"


def _read_cached(path: Path, con) -> GraphIndex | None:
    """The cached index, or None when absent or unreadable (a cache written with another version of a library,
    a truncated file, rows the snapshot `con` no longer holds): it is then built again. Its arrays are
    decompressed, or (those compression saves little of) copy-on-write maps of the file, of which only the pages a
    query touches are read; what the cache leaves out (`_slim`) is read from the snapshot or derived again. The
    file is as trusted as the snapshot beside it: both are written only by the home's owner."""
    t0 = time.perf_counter()
    try:
        idx = _unpickled(path)
        if not isinstance(idx, GraphIndex):
            return None
        idx = _filled(con, idx)
    except Exception:  # noqa: BLE001 - absent or unreadable: built again
        return None
    seconds = time.perf_counter() - t0
    return replace(idx, loaded_at=time.time(), load_seconds=seconds,
                   stats={**idx.stats, "load_seconds": round(seconds, 3), "cached": True})


def _unpickled(path: Path):
    """The `_slim` index a cache file holds: its compressed arrays decompressed, the others mapped from the file.
    What is compressed is read by `pread`, not through the map: a mapped page read stays in the process's resident
    memory as long as the map (+116 MB after a load at 50,000 documents, the compressed arrays beside their copies).
    A file of another layout (no `_MAGIC`) raises ValueError."""
    import pyarrow as pa  # imported by the load's vector read (`_vectors`) anyway

    with open(path, "rb") as f:
        fd = f.fileno()
        magic, at, n_stream, n_buffers = _HEADER.unpack(os.pread(fd, _HEADER.size, 0))
        if magic != _MAGIC:
            raise ValueError(f"{path} is not an index cache of this layout")
        spans = np.frombuffer(os.pread(fd, 24 * n_buffers, at + n_stream), dtype=np.uint64).reshape(-1, 3)
        data = memoryview(mmap.mmap(fd, 0, access=mmap.ACCESS_COPY))
        codec, pool = pa.Codec(_CODEC), pa.system_memory_pool()  # malloc's: mimalloc kept what a load had freed
        buffers = (data[o:o + n] if not packed else
                   codec.decompress(os.pread(fd, packed, o), decompressed_size=n, memory_pool=pool)
                   for o, n, packed in spans.tolist())
        stream = pa.CompressedInputStream(pa.BufferReader(os.pread(fd, n_stream, at)), _CODEC)
        # an unpickler each: each pickle numbers its objects from 0, which a cleared unpickler memo does not do again
        head = pickle.Unpickler(stream, buffers=buffers).load()
        return replace(head, **{name: pickle.Unpickler(stream, buffers=buffers).load() for name in _PARTS})


_PARTS = ("chunks", "entities", "mentions", "facts", "communities", "graph", "lexical")  # pickled one at a time


def _slim(name: str, part):
    """What the disk cache holds of one part of the index: the part without what the snapshot beside it already
    stores compactly (the int8 vectors, the passage texts; of the facts' texts, parts of those, their spans only) or
    what is quick to derive (the walk's transition and the degrees, from the adjacency; the nearest-row bounds'
    projections, from the vectors and the axes; the graph's node ids and maps, from the parts' ids and maps; the
    entities' document frequencies, from the mentions), with the adjacency as one triangle and integer-valued matrices in small integer types: at
    10,000 documents 212 MB of cache held 78 MB of such vectors and texts and 21 MB of transition values; at
    100,000, 1,566 MB held 49 MB of facts by entity (a transpose) and 110 MB of passages' community coverage (a
    product of the mentions)."""
    if name == "chunks":
        return replace(part, vecs=None, texts=None)
    if name == "entities":
        return replace(part, vecs=None, df=None, idf=None, near=_axes_only(part.near))
    if name == "mentions":
        return replace(part, counts=_IntegerCSR.of(part.counts))
    if name == "facts":
        return replace(part, vecs=None, texts=replace(part.texts, within=None), by_entity=None,
                       near=_axes_only(part.near), entities=_IntegerCSR.of(part.entities))
    if name == "communities":
        return replace(part, vecs=None, coverage=None)
    if name == "graph":
        return replace(part, dangling=None, degree=None, node_ids=None,
                       node_pos=None, transition32=None, columns32=None, matvec32=None)
    return part


def _shared(strings: list) -> list:
    """`strings` with each distinct value one object, held once in memory and written once by pickle (a
    document's title and source repeat for each of its passages, an entity type for each entity)."""
    one: dict = {}
    return [one.setdefault(x, x) for x in strings]


def _axes_only(near: CosineBound) -> CosineBound:
    """The bound without the rows' projections, which `CosineBound.on` makes again from the vectors and the
    axes (15 MB of the cache at 10,000 documents)."""
    return near if near.clusters is not None else replace(near, head=None, rest=None, error=None)


def _with_rows(near: CosineBound, vecs: Int8Rows) -> CosineBound:
    return near if near.clusters is not None else CosineBound.on(vecs, near.axes)


@dataclass(frozen=True)
class _IntegerCSR:
    """A CSR matrix whose values are small whole numbers (mention counts, 0/1), stored in the smallest unsigned
    integer type that holds them: a quarter of float32 for counts below 256."""

    shape: tuple[int, int]
    indptr: np.ndarray
    indices: "Ascending | np.ndarray"
    values: np.ndarray
    dtype: np.dtype

    @classmethod
    def of(cls, m: sp.csr_matrix) -> "_IntegerCSR | sp.csr_matrix":
        data = m.data
        if not len(data) or data.min() < 0 or not np.array_equal(data, np.floor(data)):
            return m
        values = data.astype(np.min_scalar_type(int(data.max())))
        return cls(m.shape, m.indptr, Ascending.of(m.indices, m.indptr), values, data.dtype) \
            if np.array_equal(values, data) else m

    def matrix(self) -> sp.csr_matrix:
        return sp.csr_matrix((self.values.astype(self.dtype), unpacked(self.indices, self.indptr), self.indptr),
                             shape=self.shape)


def _csr(m: "_IntegerCSR | sp.csr_matrix") -> sp.csr_matrix:
    return m.matrix() if isinstance(m, _IntegerCSR) else m


@dataclass(frozen=True)
class _Triangle:
    """A structurally symmetric CSR matrix (sorted indices) as its upper triangle, the diagonal included, with
    its values as codes into their distinct values (edge weights take few: 24k of 1M at 10,000 documents), and
    the few entries below the diagonal that differ from their mirror image (a pair's duplicate edges, summed in
    another order, can differ in the last bit): the adjacency in a quarter of the bytes, rebuilt to the bit."""

    shape: tuple[int, int]
    indptr: np.ndarray
    offsets: "Ascending | np.ndarray"  # each entry's column less its row
    values: np.ndarray                 # the distinct values, or every entry's when that is smaller
    codes: np.ndarray | None           # each entry's index in `values` (None: `values` is per entry)
    fixed_at: np.ndarray | None = None  # positions in the whole matrix's data whose value is not the mirrored one
    fixed: np.ndarray | None = None

    @classmethod
    def of(cls, a: sp.csr_matrix) -> "_Triangle | sp.csr_matrix":
        """The triangle of `a`, or `a` itself when it is not structurally symmetric (checked with `_mirrors`, not
        by building the whole matrix again from the triangle, with its transposed copy 30 bytes an entry at
        once). Made a block of rows at a time, so no array of every entry is held but a mask: the rows of all
        the entries, the mask of those above and the triangle's values before their coding were 14 bytes an
        entry beside `a` at once."""
        n = a.shape[0]
        if a.shape[0] != a.shape[1] or not a.has_sorted_indices:
            return a
        blocks = _row_blocks(a.indptr, min(_TRIANGLE_BLOCK, max(a.nnz // 8, 1 << 12)))
        differs = _mirrors(a, blocks)
        if differs is None:
            return a
        upper = np.empty(a.nnz, dtype=bool)
        per_row = np.zeros(n, dtype=a.indptr.dtype)
        for r0, r1, s, e in blocks:
            rows = np.repeat(np.arange(r0, r1, dtype=a.indices.dtype), np.diff(a.indptr[r0:r1 + 1]))
            np.greater_equal(a.indices[s:e], rows, out=upper[s:e])
            per_row[r0:r1] = np.bincount(rows[upper[s:e]] - r0, minlength=r1 - r0)
        differs[upper] = False
        fixed_at = np.flatnonzero(differs)
        del differs
        indptr = np.zeros(n + 1, dtype=a.indptr.dtype)
        np.cumsum(per_row, out=indptr[1:])
        del per_row
        offsets = np.empty(indptr[-1], dtype=a.indices.dtype)
        values = np.unique(np.concatenate([np.unique(a.data[s:e][upper[s:e]]) for _, _, s, e in blocks]
                                          or [a.data[:0]]))
        codes = np.empty(indptr[-1], dtype=np.min_scalar_type(max(len(values) - 1, 0)))
        for r0, r1, s, e in blocks:
            u = upper[s:e]
            rows = np.repeat(np.arange(r0, r1, dtype=a.indices.dtype), np.diff(a.indptr[r0:r1 + 1]))
            t0, t1 = indptr[r0], indptr[r1]
            np.subtract(a.indices[s:e][u], rows[u], out=offsets[t0:t1])
            codes[t0:t1] = np.searchsorted(values, a.data[s:e][u])
        if codes.nbytes + values.nbytes >= a.data.itemsize * len(codes):
            values, codes = a.data[upper], None
        return cls(a.shape, indptr, Ascending.of(offsets, indptr), values, codes, fixed_at, a.data[fixed_at])

    def matrix(self) -> sp.csr_matrix:
        """Row i of the whole matrix is row i of the lower triangle (the upper one's column i) then row i of the
        upper one: the rows come out sorted with no sorting, only a transpose and two scatters."""
        n = self.shape[0]
        data = self.values[self.codes] if self.codes is not None else self.values
        offsets = unpacked(self.offsets, self.indptr)
        rows = np.repeat(np.arange(n, dtype=offsets.dtype), np.diff(self.indptr))
        upper = offsets + rows
        strict = offsets > 0
        below = sp.csr_matrix((data[strict], upper[strict], np.concatenate(
            [[0], np.cumsum(np.bincount(rows[strict], minlength=n))]).astype(self.indptr.dtype)),
            shape=self.shape).tocsc()  # by column: the rows of the lower triangle, their columns ascending
        del strict, offsets
        nnz = len(data) + below.nnz
        indices = np.empty(nnz, dtype=upper.dtype)
        values = np.empty(nnz, dtype=data.dtype)
        at = np.arange(below.nnz, dtype=np.int64) + self.indptr[np.repeat(np.arange(n), np.diff(below.indptr))]
        indices[at], values[at] = below.indices, below.data
        at = np.arange(len(data), dtype=np.int64)
        at += below.indptr[rows + 1]
        indices[at], values[at] = upper, data
        del at, upper, rows
        if self.fixed_at is not None:
            values[self.fixed_at] = self.fixed
        m = sp.csr_matrix((values, indices, (self.indptr + below.indptr).astype(self.indptr.dtype)), shape=self.shape)
        m.has_sorted_indices = True
        return m


def _matrix(adjacency: "_Triangle | sp.csr_matrix") -> sp.csr_matrix:
    return adjacency.matrix() if isinstance(adjacency, _Triangle) else adjacency


def _row_blocks(indptr: np.ndarray, size: int) -> list[tuple[int, int, int, int]]:
    """(first row, end row, first entry, end entry) of consecutive blocks of rows of about `size` entries each
    (a longer row alone)."""
    cuts = np.unique(np.searchsorted(indptr, np.arange(0, indptr[-1], size), side="right") - 1).tolist()
    ends = [*cuts[1:], len(indptr) - 1]
    return [(r0, r1, int(indptr[r0]), int(indptr[r1])) for r0, r1 in zip(cuts, ends)]


def _mirrors(a: sp.csr_matrix, blocks: list[tuple[int, int, int, int]]) -> np.ndarray | None:
    """Where each entry of `a` (sorted indices) differs bit for bit from its mirror image, or None when `a` is not
    structurally symmetric. `a` by columns is its transpose by rows: made here for a block of columns at a time
    (their entries, rows ascending, placed by column as scipy's stable COO -> CSR does), it has the block's rows'
    structure when `a` is structurally symmetric, and its values are then their mirrors'. The whole column form
    beside the mask took 13 bytes an entry at once."""
    from scipy.sparse._sparsetools import coo_tocsr

    n, index = a.shape[0], a.indices.dtype
    bits = f"u{a.data.dtype.itemsize}"
    differs = np.empty(a.nnz, dtype=bool)
    inside, below = np.empty(a.nnz, dtype=bool), np.empty(a.nnz, dtype=bool)
    for r0, r1, s, e in blocks:
        np.greater_equal(a.indices, r0, out=inside)
        np.less(a.indices, r1, out=below)
        inside &= below
        at = np.flatnonzero(inside)  # the entries of columns r0..r1-1, by row
        if len(at) != e - s:
            return None
        rows = (np.searchsorted(a.indptr, at, side="right") - 1).astype(index)
        bp, bj, bx = np.empty(r1 - r0 + 1, dtype=index), np.empty(len(at), dtype=index), np.empty(len(at), a.dtype)
        coo_tocsr(r1 - r0, n, len(at), a.indices[at] - index.type(r0), rows, a.data[at], bp, bj, bx)
        del at, rows
        if not (np.array_equal(bp, a.indptr[r0:r1 + 1] - a.indptr[r0]) and np.array_equal(bj, a.indices[s:e])):
            return None
        np.not_equal(bx.view(bits), a.data[s:e].view(bits), out=differs[s:e])
    return differs


_TRIANGLE_BLOCK = 1 << 21  # entries of a block of rows made at once (an eighth of them at most: a block's
                           # scratch is ~40 bytes an entry, the masks of every entry 4)


def _filled(con, idx: GraphIndex) -> GraphIndex:
    """A `_slim` index made whole again from the snapshot `con` (KeyError when it lacks a row the index has).
    Read through DuckDB's numpy results, not Arrow: importing Arrow (and what its conversions import) took longer
    than the rest of a cached load."""
    ns = idx.namespace
    chunk_vecs = _stored_vectors(con, ns, "chunk", idx.chunks.ids)
    vecs = {kind: _fit_dim(_stored_vectors(con, ns, kind, ids), idx.dim) for kind, ids in
            (("entity", idx.entities.ids), ("fact", idx.facts.ids), ("community", idx.communities.ids))}
    t32, columns32, degree = _transitions(_matrix(idx.graph.adjacency))
    counts, fact_entities = _csr(idx.mentions.counts), _csr(idx.facts.entities)
    df, idf = _entity_df(counts)
    chunk_texts = _texts(con, "chunks", "chunk_id", ns, idx.chunks.ids)
    return replace(
        idx, chunks=replace(idx.chunks, vecs=chunk_vecs, texts=chunk_texts),
        entities=replace(idx.entities, vecs=vecs["entity"], df=df, idf=idf,
                         near=_with_rows(idx.entities.near, vecs["entity"])),
        mentions=replace(idx.mentions, counts=counts),
        facts=replace(idx.facts, vecs=vecs["fact"], texts=replace(idx.facts.texts, within=chunk_texts),
                      entities=fact_entities, by_entity=fact_entities.T.tocsr(),
                      near=_with_rows(idx.facts.near, vecs["fact"])),
        communities=replace(idx.communities, vecs=vecs["community"],
                            coverage=_coverage(counts, idx.communities.members)),
        graph=replace(idx.graph, dangling=degree <= 0, degree=degree,
                      node_ids=NodeIds(idx.entities.ids, idx.chunks.ids), node_pos=NodePositions(idx.entities.pos, idx.chunks.pos),
                      transition32=t32, columns32=columns32, matvec32=_matvec(t32)))


def _stored_vectors(con, ns: str, kind: str, ids: Sequence[str]) -> Int8Rows:
    """`_vectors` of codes stored as TINYINT[] (a snapshot published before the codes were BLOBs), as numpy arrays
    straight from DuckDB; BLOBs of codes, read as they are, and a snapshot's float vectors go through `_vectors`."""
    from lazyhippo.stores.warehouse import vector_type

    if vector_type(con) != "TINYINT[]":
        return _vectors(con, ns, kind, ids)[0]
    p = {"ns": ns, "kind": kind}
    where = "FROM embeddings WHERE namespace = $ns AND kind = $kind"
    # both in the table's order (DuckDB keeps insertion order where a query has no ORDER BY): sorting the
    # vectors took as long as reading them
    head = con.execute(f"SELECT item_id, scale, len(vector) AS dim {where}", p).fetchnumpy()
    if not len(head["item_id"]):
        return Int8Rows.zeros(len(ids), 0)
    dim = int(head["dim"][0])
    if not np.all(head["dim"] == dim):
        return _vectors(con, ns, kind, ids)[0]
    flat = con.execute(f"SELECT unnest(vector) AS v {where}", p).fetchnumpy()["v"]
    if len(flat) != len(head["item_id"]) * dim:
        raise KeyError(f"the {kind} vectors changed while they were read")
    pos = _positions(ids)
    rows = np.fromiter((pos.get(i, -1) for i in head["item_id"]), dtype=np.int64, count=len(head["item_id"]))
    keep = rows >= 0
    out = Int8Rows.zeros(len(ids), dim)
    out.q[rows[keep]] = np.asarray(flat, dtype=np.int8).reshape(-1, dim)[keep]
    out.scale[rows[keep]] = head["scale"][keep]
    return out


def _texts(con, table: str, key: str, ns: str, ids: Sequence[str]) -> Texts:
    """The `text` of `table`'s rows in the order of their keys `ids`; KeyError when a key has no row. Read by
    batches, each text kept as its UTF-8 bytes until all are joined: all rows as Python tuples of strings took
    more than the texts' buffer. The keys' dict lives for the read only."""
    pos = _positions(ids)
    out: list = [None] * len(ids)
    con.execute(f"SELECT {key}, text FROM {table} WHERE namespace = ?", [ns])
    while rows := con.fetchmany(_BATCH_ROWS):
        for k, text in rows:
            i = pos.get(k)
            if i is not None and text is not None:
                out[i] = text.encode()
    if any(t is None for t in out):
        raise KeyError(f"the snapshot lacks {table} of the cached index")
    return Texts.of_bytes(out)


_MAGIC = b"lhidx\x00\x00\x02"  # the layout: a file without it (an older one) is read as absent and built again
_HEADER = struct.Struct("<8sQQQ")  # the magic, the pickles' offset and compressed length, the number of arrays
_ALIGN = 64
_CODEC = "zstd"
_LEVEL = 3
_BLOCK = 1 << 22  # compressed by blocks of 4 MB, one zstd frame each: the compressor works on a block, not an array
_PACKED_AT_MOST = 0.9  # an array whose compression saves less stays mapped: read only where a query touches it


def _write_cached(path: Path, idx: GraphIndex) -> None:
    """Write atomically, and drop the namespace's caches of other snapshot versions; a home that cannot be written
    (a read-only replica) goes without. The file: the header, the arrays out of band written as pickle meets them,
    the zstd-compressed pickles of the index's head and of each `_slim` part, and each array's (offset, length,
    compressed length or 0). Arrays are compressed (a load and the first queries read nearly all of them whole:
    at 50,000 documents 263 of 273 MB) unless that saves little (hashes, float ranks, packed offsets), which are
    written aligned and mapped. A part's slim form is made and written before the next one's: the whole slim
    index and its pickle stream in memory beside the index took 0.9 GB at 100,000 documents."""
    import pyarrow as pa

    codec, pool = pa.Codec(_CODEC, compression_level=_LEVEL), pa.system_memory_pool()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    spans: list[tuple[int, int, int]] = []
    try:
        path.parent.mkdir(exist_ok=True)
        with open(tmp, "wb") as f, tempfile.TemporaryFile(dir=path.parent) as stream:
            f.write(b"\0" * _HEADER.size)

            def out_of_band(buffer: pickle.PickleBuffer) -> bool:
                raw = buffer.raw()
                blocks = [codec.compress(raw[a:a + _BLOCK], asbytes=True, memory_pool=pool)
                          for a in range(0, raw.nbytes, _BLOCK)]
                packed = sum(map(len, blocks))
                if packed > _PACKED_AT_MOST * raw.nbytes:
                    blocks, packed = [raw], 0
                    f.write(b"\0" * (-f.tell() % _ALIGN))
                spans.append((f.tell(), raw.nbytes, packed))
                for block in blocks:
                    f.write(block)
                return False

            pickler = pickle.Pickler(stream, protocol=5, buffer_callback=out_of_band)
            pickler.dump(replace(idx, **dict.fromkeys(_PARTS)))
            for name in _PARTS:
                pickler.clear_memo()  # no part refers to another's objects: its slim copies go once it is written
                pickler.dump(_slim(name, getattr(idx, name)))
            del pickler
            at = f.tell()
            stream.seek(0)
            while block := stream.read(_BLOCK):
                f.write(codec.compress(block, asbytes=True, memory_pool=pool))
            n_stream = f.tell() - at
            f.write(np.asarray(spans, dtype=np.uint64).reshape(-1, 3).tobytes())
            f.seek(0)
            f.write(_HEADER.pack(_MAGIC, at, n_stream, len(spans)))
        os.replace(tmp, path)
        version = path.name.rsplit("-", 2)[1]
        for old in path.parent.glob(f"{idx.namespace}-*-*.pickle"):
            name, old_version, _ = old.name.rsplit("-", 2)
            if name == idx.namespace and old_version != version:
                old.unlink(missing_ok=True)
    except OSError:
        tmp.unlink(missing_ok=True)


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()
