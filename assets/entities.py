import dagster as dg

from lazyhippo.index import build_graph_tables
from resources import GraphStoreResource, LazyhippoResource

from ._meta import preview
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.multi_asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS,
    specs=[dg.AssetSpec("entities", deps=["extractions"], description="Entities deduplicated by normalized name (dbt_like_sql/entities.sql)."),
           dg.AssetSpec("relations", deps=["extractions"], description="Weighted entity relations (dbt_like_sql/relations.sql)."),
           dg.AssetSpec("mentions", deps=["extractions"], description="Chunk-entity mentions (dbt_like_sql/mentions.sql)."),
           dg.AssetSpec("facts", deps=["extractions"], description="Sentences linked to the entities they name (dbt_like_sql/facts.sql).")],
    group_name="graph",
)
def entity_graph_tables(lazyhippo: LazyhippoResource, graph_store: GraphStoreResource):
    settings = lazyhippo.settings()
    ns = [settings.namespace]
    with graph_store.session() as store, lazyhippo.warehouse() as con:
        counts = build_graph_tables(settings, con)
        synced = store.sync(con, settings.namespace, "graph_tables")
        top = preview(con, "SELECT name, type, mention_count, degree FROM entities WHERE namespace = ? "
                      "ORDER BY mention_count DESC, degree DESC, name LIMIT 15", ns, ["entity", "type", "mentions", "degree"])
        rels = preview(con, "SELECT a.name, b.name, r.weight, r.description FROM relations r "
                       "JOIN entities a ON a.namespace = r.namespace AND a.entity_id = r.source_id "
                       "JOIN entities b ON b.namespace = r.namespace AND b.entity_id = r.target_id "
                       "WHERE r.namespace = ? ORDER BY r.weight DESC, 1, 2 LIMIT 15", ns, ["source", "target", "weight", "description"])
    extra = {f"graph_store_{k}": v for k, v in synced.items()}
    yield dg.MaterializeResult(asset_key="entities", metadata={"dagster/row_count": counts["entities"], "top_entities": top, **extra})
    yield dg.MaterializeResult(asset_key="relations", metadata={"dagster/row_count": counts["relations"], "strongest": rels})
    yield dg.MaterializeResult(asset_key="mentions", metadata={"dagster/row_count": counts["mentions"]})
    yield dg.MaterializeResult(asset_key="facts", metadata={"dagster/row_count": counts["facts"]})
