"""Graph completeness audit as blocking asset checks: thin wrappers over lazyhippo.evaluate.audit.

Each check reads the graph on the configured store: the warehouse tables for `embedded`, Cypher counts on the
served graph for `neo4j`. A failing check stops the downstream assets of the run. Each check is partitioned
by namespace like its asset, so every knowledge base has its own check history.
"""

from contextlib import contextmanager
from typing import Iterator

import dagster as dg

from lazyhippo.evaluate import audit
from lazyhippo.stores.warehouse import read_vectors
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import check_result
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource


@contextmanager
def _facts(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> Iterator[audit.GraphFacts]:
    namespace = lazyhippo.settings().namespace
    if graph_store.resolved_kind == "neo4j":
        yield audit.Neo4jFacts(graph_store.store, namespace)
    else:
        with lazyhippo.warehouse() as con:
            yield audit.WarehouseFacts(con, namespace)


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="entities", blocking=True, description="The graph is not empty: the namespace has entities.")
def graph_not_empty(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_not_empty(facts))


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="knn_edges", blocking=True,
                description="KNN is enabled and some pair of entities reaches the cutoff, but no SEMANTICALLY_SIMILAR edge was written.")
def knn_edges_present(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    """The best pair's similarity (every entity vector read) is only asked for when there is no edge."""
    settings = lazyhippo.settings()
    with _facts(lazyhippo, graph_store) as facts:
        edges = facts.knn_edge_count()
    best = None
    if not edges:
        with lazyhippo.warehouse() as con:
            best = audit.best_pair_similarity(read_vectors(con, settings.namespace, "entity")[1])
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_knn_edges(facts, settings.knn_top_k, settings.knn_cutoff, best))


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="knn_edges", blocking=True, description="Every KNN edge joins two entities of the namespace.")
def knn_edges_no_orphans(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_orphan_edges(facts, ("knn",)))


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="relations", blocking=True, description="Every relation joins two entities of the namespace.")
def relations_no_orphans(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_orphan_edges(facts, ("relations",)))


class ChunkMentionsConfig(dg.Config):
    max_unmentioned_share: float = 0.2  # forms, bare headings and the like legitimately mention nothing


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="mentions", blocking=True,
                description="Share of chunks that mention no entity stays under a threshold (all such chunks listed).")
def chunks_have_mentions(config: ChunkMentionsConfig, lazyhippo: LazyhippoResource,
                         graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_chunk_mentions(facts, config.max_unmentioned_share))


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="communities", blocking=True, description="Every entity has a community_id.")
def entities_have_community(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_entity_communities(facts))


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="communities", blocking=True, description="Every entity has a PageRank.")
def entities_have_pagerank(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_entity_pagerank(facts))


@dg.asset_check(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, asset="community_summaries", blocking=True, description="Every community has a summary.")
def communities_have_summary(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource) -> dg.AssetCheckResult:
    with _facts(lazyhippo, graph_store) as facts:
        return check_result(audit.check_community_summaries(facts))
