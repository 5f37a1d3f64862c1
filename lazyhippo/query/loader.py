"""Load one namespace of the warehouse into an in-memory `GraphIndex`, once per (db, namespace, mtime).

Everything a query touches lives in numpy / scipy.sparse / bm25s structures, so a query never goes
back to DuckDB: vectors as row-aligned float32 matrices, the entity+passage graph as CSR, id maps as
dicts. The cache is per process and keyed by the database file's path, namespace, modification time
and the graph edge weights; a re-index changes the mtime and the next query reloads.
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from ..config import Settings
from .config import GraphParams
from .ppr import transition_matrix
from .text import norm_key, tokens


@dataclass
class GraphIndex:
    namespace: str
    db_path: str
    loaded_at: float
    load_seconds: float
    # chunks (passages), row order = chunk index
    chunk_ids: list[str]
    chunk_pos: dict[str, int]
    doc_ids: list[str]
    titles: list[str]
    sections: list[str | None]
    pages: list[int | None]
    positions: np.ndarray
    texts: list[str]
    content_hashes: list[str]
    n_tokens: np.ndarray
    sources: list[str]
    chunk_vecs: np.ndarray            # (n_chunks, dim), zero rows where a chunk has no vector
    # entities
    entity_ids: list[str]
    entity_pos: dict[str, int]
    entity_names: list[str]
    entity_types: list[str]
    entity_vecs: np.ndarray
    entity_df: np.ndarray             # passages mentioning each entity
    entity_idf: np.ndarray
    name_index: dict[str, np.ndarray] # norm_key(name) -> entity indices
    title_index: dict[str, np.ndarray]  # norm_key(document title) -> chunk indices
    title_entity: np.ndarray          # chunk index -> entity index of its title (-1 if none)
    title_base_entity: np.ndarray     # chunk index -> entity of the title without a "(...)" qualifier (-1 if none)
    mentions: sp.csr_matrix           # (n_chunks, n_entities) mention counts
    # facts
    fact_ids: list[str]
    fact_chunk: np.ndarray
    fact_texts: list[str]
    fact_entities: sp.csr_matrix      # (n_facts, n_entities) 0/1
    fact_vecs: np.ndarray
    # communities
    community_ids: list[str]
    community_titles: list[str]
    community_summaries: list[str]
    community_hubs: list[list[str]]
    community_vecs: np.ndarray
    community_members: list[np.ndarray]   # entity indices per community
    community_tokens: list[set[str]]
    entity_pagerank: np.ndarray
    # graph: nodes 0..n_entities-1 are entities, then chunks
    adjacency: sp.csr_matrix
    transition: sp.csr_matrix
    dangling: np.ndarray
    node_ids: list[str]
    node_pos: dict[str, int]
    bm25: object | None
    bm25_vocab: dict[str, int]
    dim: int
    embedding_model: str | None
    graph_params: GraphParams
    stats: dict = field(default_factory=dict)

    @property
    def n_chunks(self) -> int:
        return len(self.chunk_ids)

    @property
    def n_entities(self) -> int:
        return len(self.entity_ids)

    def chunk_node(self, c: int) -> int:
        return self.n_entities + c


def _table(con, sql: str, params: dict):
    return con.sql(sql, params=params).to_arrow_table()


def _vectors(con, ns: str, kind: str, order: dict[str, int], n: int) -> tuple[np.ndarray, str | None]:
    tbl = _table(con, "SELECT item_id, model, vector FROM embeddings WHERE namespace = $ns AND kind = $kind",
                 {"ns": ns, "kind": kind})
    ids = tbl.column("item_id").to_pylist()
    if not ids:
        return np.zeros((n, 0), dtype=np.float32), None
    col = tbl.column("vector").combine_chunks()
    flat = col.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    mat = flat.reshape(len(ids), -1)
    out = np.zeros((n, mat.shape[1]), dtype=np.float32)
    rows = np.array([order.get(i, -1) for i in ids])
    keep = rows >= 0
    out[rows[keep]] = mat[keep]
    return out, tbl.column("model")[0].as_py()


def _fit_dim(mat: np.ndarray, dim: int) -> np.ndarray:
    if mat.shape[1] == dim:
        return mat
    return np.zeros((mat.shape[0], dim), dtype=np.float32)


def build_index(con, namespace: str, db_path: str, params: GraphParams) -> GraphIndex:
    t0 = time.perf_counter()
    ns = {"ns": namespace}
    ch = _table(con, """
        SELECT c.chunk_id, c.doc_id, c.title, c.section, c.page, c.position, c.text, c.content_hash, c.n_tokens,
               coalesce(d.source, c.doc_id) AS source
        FROM chunks c LEFT JOIN documents d ON d.namespace = c.namespace AND d.doc_id = c.doc_id
        WHERE c.namespace = $ns ORDER BY c.doc_id, c.position""", ns).to_pydict()
    chunk_ids = ch["chunk_id"]
    chunk_pos = {c: i for i, c in enumerate(chunk_ids)}
    n_p = len(chunk_ids)

    en = _table(con, "SELECT entity_id, name, type FROM entities WHERE namespace = $ns ORDER BY entity_id", ns).to_pydict()
    entity_ids = en["entity_id"]
    entity_pos = {e: i for i, e in enumerate(entity_ids)}
    n_e = len(entity_ids)

    mt = _table(con, "SELECT chunk_id, entity_id, count FROM mentions WHERE namespace = $ns", ns).to_pydict()
    m_rows, m_cols, m_vals = [], [], []
    for c, e, k in zip(mt["chunk_id"], mt["entity_id"], mt["count"]):
        if c in chunk_pos and e in entity_pos:
            m_rows.append(chunk_pos[c]); m_cols.append(entity_pos[e]); m_vals.append(float(k))
    mentions = sp.csr_matrix((m_vals, (m_rows, m_cols)), shape=(n_p, n_e), dtype=np.float32)
    df = np.asarray((mentions > 0).sum(axis=0)).ravel().astype(np.float64)
    idf = np.log((n_p + 1.0) / (df + 1.0)) + 1.0 / max(math.log(n_p + 2.0), 1.0)

    name_index: dict[str, list[int]] = defaultdict(list)
    for i, name in enumerate(en["name"]):
        key = norm_key(name)
        if key:
            name_index[key].append(i)
    title_index: dict[str, list[int]] = defaultdict(list)
    title_entity = np.full(n_p, -1, dtype=np.int64)
    title_base_entity = np.full(n_p, -1, dtype=np.int64)
    for i, title in enumerate(ch["title"]):
        key = norm_key(title or "")
        if key:
            title_index[key].append(i)
            cands = name_index.get(key) or name_index.get(norm_key(_drop_article(title or "")))
            if cands:
                title_entity[i] = cands[0]
            base = _QUALIFIER.sub("", title or "").strip()
            if base and base != title:
                cands = name_index.get(norm_key(base)) or name_index.get(norm_key(_drop_article(base)))
                if cands and cands[0] != title_entity[i]:
                    title_base_entity[i] = cands[0]

    fa = _table(con, "SELECT fact_id, chunk_id, text, entity_ids FROM facts WHERE namespace = $ns ORDER BY fact_id", ns).to_pydict()
    fact_ids, fact_chunk, fact_texts, f_rows, f_cols = [], [], [], [], []
    for fid, c, text, ents in zip(fa["fact_id"], fa["chunk_id"], fa["text"], fa["entity_ids"]):
        if c not in chunk_pos:
            continue
        row = len(fact_ids)
        fact_ids.append(fid); fact_chunk.append(chunk_pos[c]); fact_texts.append(text)
        for e in set(ents or []):
            if e in entity_pos:
                f_rows.append(row); f_cols.append(entity_pos[e])
    fact_entities = sp.csr_matrix((np.ones(len(f_rows), dtype=np.float32), (f_rows, f_cols)), shape=(len(fact_ids), n_e))

    chunk_vecs, model = _vectors(con, namespace, "chunk", chunk_pos, n_p)
    dim = chunk_vecs.shape[1]
    entity_vecs, _ = _vectors(con, namespace, "entity", entity_pos, n_e)
    fact_vecs, _ = _vectors(con, namespace, "fact", {f: i for i, f in enumerate(fact_ids)}, len(fact_ids))

    cs = _table(con, "SELECT community_id, title, summary, hub_entities FROM community_summaries "
                     "WHERE namespace = $ns ORDER BY community_id", ns).to_pydict()
    community_ids = cs["community_id"]
    cpos = {c: i for i, c in enumerate(community_ids)}
    community_vecs, _ = _vectors(con, namespace, "community", cpos, len(community_ids))
    sc = _table(con, "SELECT entity_id, community_id, pagerank FROM entity_scores WHERE namespace = $ns", ns).to_pydict()
    members: list[list[int]] = [[] for _ in community_ids]
    pagerank = np.zeros(n_e)
    for e, c, pr in zip(sc["entity_id"], sc["community_id"], sc["pagerank"]):
        if e in entity_pos:
            pagerank[entity_pos[e]] = pr
            if c in cpos:
                members[cpos[c]].append(entity_pos[e])

    # graph: entities then chunks
    n = n_e + n_p
    rows, cols, vals = [], [], []
    rl = _table(con, "SELECT source_id, target_id, weight FROM relations WHERE namespace = $ns "
                     "AND coalesce(weight, 1.0) >= $minw", {**ns, "minw": params.relation_min_weight}).to_pydict()
    skip = {i for i, t in enumerate(en["type"]) if t in params.relation_skip_types} if params.relation_skip_types else set()
    for a, b, w in zip(rl["source_id"], rl["target_id"], rl["weight"]):
        i, j = entity_pos.get(a), entity_pos.get(b)
        if i is None or j is None or i == j or i in skip or j in skip:
            continue
        w = params.relation_weight * min(float(w or 1.0), params.relation_cap)
        rows += [i, j]; cols += [j, i]; vals += [w, w]
    kn = _table(con, "SELECT source_id, target_id, score FROM knn_edges WHERE namespace = $ns AND score >= $m",
                {**ns, "m": params.synonym_min_score}).to_pydict()
    for a, b, s in zip(kn["source_id"], kn["target_id"], kn["score"]):
        i, j = entity_pos.get(a), entity_pos.get(b)
        if i is None or j is None or i == j:
            continue
        w = params.synonym_weight * float(s)
        rows += [i, j]; cols += [j, i]; vals += [w, w]
    mc = mentions.tocoo()
    mw = params.mention_weight * np.log1p(mc.data)
    is_title = title_entity[mc.row] == mc.col
    mw = mw + params.title_mention_weight * is_title
    rows = np.concatenate([np.asarray(rows, dtype=np.int64), mc.row + n_e, mc.col])
    cols = np.concatenate([np.asarray(cols, dtype=np.int64), mc.col, mc.row + n_e])
    vals = np.concatenate([np.asarray(vals, dtype=np.float64), mw, mw])
    adjacency = sp.csr_matrix((vals, (rows, cols)), shape=(n, n))  # duplicates are summed
    adjacency.sum_duplicates()
    transition, dangling = transition_matrix(adjacency)

    bm25, vocab = _bm25([f"{t or ''}\n{x}" for t, x in zip(ch["title"], ch["text"])])

    idx = GraphIndex(
        namespace=namespace, db_path=db_path, loaded_at=time.time(), load_seconds=0.0,
        chunk_ids=chunk_ids, chunk_pos=chunk_pos, doc_ids=ch["doc_id"], titles=[t or "" for t in ch["title"]],
        sections=ch["section"], pages=ch["page"], positions=np.asarray(ch["position"], dtype=np.int64),
        texts=ch["text"], content_hashes=ch["content_hash"], n_tokens=np.asarray(ch["n_tokens"], dtype=np.int64),
        sources=ch["source"], chunk_vecs=chunk_vecs,
        entity_ids=entity_ids, entity_pos=entity_pos, entity_names=en["name"], entity_types=[t or "" for t in en["type"]],
        entity_vecs=_fit_dim(entity_vecs, dim), entity_df=df, entity_idf=idf,
        name_index={k: np.asarray(v, dtype=np.int64) for k, v in name_index.items()},
        title_index={k: np.asarray(v, dtype=np.int64) for k, v in title_index.items()},
        title_entity=title_entity, title_base_entity=title_base_entity, mentions=mentions,
        fact_ids=fact_ids, fact_chunk=np.asarray(fact_chunk, dtype=np.int64), fact_texts=fact_texts,
        fact_entities=fact_entities, fact_vecs=_fit_dim(fact_vecs, dim),
        community_ids=community_ids, community_titles=cs["title"], community_summaries=cs["summary"],
        community_hubs=[list(h or []) for h in cs["hub_entities"]], community_vecs=_fit_dim(community_vecs, dim),
        community_members=[np.asarray(m, dtype=np.int64) for m in members],
        community_tokens=[set(tokens(f"{t} {s} {' '.join(h or [])}")) for t, s, h in
                          zip(cs["title"], cs["summary"], cs["hub_entities"])],
        entity_pagerank=pagerank,
        adjacency=adjacency, transition=transition, dangling=dangling,
        node_ids=list(entity_ids) + list(chunk_ids), node_pos={**entity_pos, **{c: n_e + i for i, c in enumerate(chunk_ids)}},
        bm25=bm25, bm25_vocab=vocab, dim=dim, embedding_model=model, graph_params=params)
    idx.load_seconds = time.perf_counter() - t0
    idx.stats = {"chunks": n_p, "entities": n_e, "facts": len(fact_ids), "communities": len(community_ids),
                 "graph_nodes": n, "graph_edges": int(adjacency.nnz), "load_seconds": round(idx.load_seconds, 3)}
    return idx


_QUALIFIER = re.compile(r"\s*\([^()]*\)\s*$")


def _drop_article(title: str) -> str:
    parts = title.split(maxsplit=1)
    return parts[1] if len(parts) == 2 and parts[0].lower() in ("the", "a", "an") else title


def _bm25(docs: list[str]):
    import bm25s

    toks = [tokens(d) or [""] for d in docs]
    if not docs:
        return None, {}
    retriever = bm25s.BM25()
    retriever.index(toks, show_progress=False)
    return retriever, dict(retriever.vocab_dict)


# ---------------------------------------------------------------- cache

_CACHE: "OrderedDict[tuple, GraphIndex]" = OrderedDict()
_LOCK = threading.Lock()
_MAX_CACHED = 4


def _mtime(db_path: Path) -> tuple[int, int]:
    st = db_path.stat()
    wal = db_path.with_name(db_path.name + ".wal")
    return st.st_mtime_ns, (wal.stat().st_mtime_ns if wal.exists() else 0)


def load_index(settings: Settings, params: GraphParams | None = None) -> GraphIndex:
    """The cached GraphIndex of `settings`' namespace; built on first use and after the db file changes."""
    from ..warehouse import read_path

    params = params or GraphParams()
    db_path = read_path(settings)
    if db_path is None:
        raise FileNotFoundError(f"no complete index of namespace {settings.namespace!r} in {settings.home}: build an index first")
    key = (str(db_path), settings.namespace, _mtime(db_path), params)
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit
        idx = _build(settings, str(db_path), params)
        stale = [k for k in _CACHE if k[:2] == key[:2]]
        for k in stale:
            del _CACHE[k]
        _CACHE[key] = idx
        while len(_CACHE) > _MAX_CACHED:
            _CACHE.popitem(last=False)
        return idx


def _build(settings: Settings, db_path: str, params: GraphParams) -> GraphIndex:
    """Readers open the published snapshot, which no writer ever holds: no waiting needed."""
    from ..warehouse import connect

    with connect(settings, read_only=True) as con:
        return build_index(con, settings.namespace, db_path, params)


def clear_cache() -> None:
    with _LOCK:
        _CACHE.clear()
