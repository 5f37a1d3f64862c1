"""Graph completeness audit as blocking asset checks: thin wrappers over lazyhippo.audit.

Each check reads the graph on the configured store: the warehouse tables for `embedded`, Cypher counts on the
served graph for `neo4j`. A failing check stops the downstream assets of the run.
"""

from contextlib import contextmanager
from typing import Iterator

import dagster as dg

from lazyhippo import audit
from resources import GraphStoreResource, LazyhippoResource

from ._meta import md_table
from ._partitions import WAREHOUSE_TAGS


@contextmanager
def _facts(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> Iterator[audit.GraphFacts]:
    namespace = lazyhippo.settings().namespace
    if graph_store.kind == "neo4j":
        with graph_store.session() as store:
            yield audit.Neo4jFacts(store, namespace)
    else:
        with lazyhippo.warehouse() as con:
            yield audit.WarehouseFacts(con, namespace)


def _result(res: audit.CheckResult, header: str = "failing") -> dg.AssetCheckResult:
    metadata: dict = {k: v for k, v in res.figures.items() if isinstance(v, (int, float, str))}
    if res.examples:
        metadata[header] = md_table([(e,) for e in res.examples[:200]], [header])
    return dg.AssetCheckResult(passed=res.passed, description=res.description, metadata=metadata,
                               severity=dg.AssetCheckSeverity.ERROR)


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="knn_edges", blocking=True,
                description="KNN is enabled (knn_top_k > 0) but no SEMANTICALLY_SIMILAR edge was written.")
def knn_edges_present(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_knn_edges(facts, lazyhippo.settings().knn_top_k))


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="knn_edges", blocking=True, description="Every KNN edge joins two entities of the namespace.")
def knn_edges_no_orphans(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_orphan_edges(facts, ("knn",)), "orphan edges")


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="relations", blocking=True, description="Every relation joins two entities of the namespace.")
def relations_no_orphans(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_orphan_edges(facts, ("relations",)), "orphan edges")


class ChunkMentionsConfig(dg.Config):
    max_unmentioned_share: float = 0.2  # forms, bare headings and the like legitimately mention nothing


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="mentions", blocking=True,
                description="Share of chunks that mention no entity stays under a threshold (all such chunks listed).")
def chunks_have_mentions(config: ChunkMentionsConfig, lazyhippo: LazyhippoResource,
                         graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_chunk_mentions(facts, config.max_unmentioned_share), "chunks without mentions")


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="communities", blocking=True, description="Every entity has a community_id.")
def entities_have_community(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_entity_communities(facts), "entities without community")


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="communities", blocking=True, description="Every entity has a PageRank.")
def entities_have_pagerank(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_entity_pagerank(facts), "entities without pagerank")


@dg.asset_check(op_tags=WAREHOUSE_TAGS, asset="community_summaries", blocking=True, description="Every community has a summary.")
def communities_have_summary(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return _result(audit.check_community_summaries(facts), "communities without summary")
