import dagster as dg

from lazyhippo.index import run_stage
from lazyhippo.stages.lifecycle import drop_vanished
from lazyhippo_dagster.assets._kinds import store_kinds
from lazyhippo_dagster.assets._partitions import WAREHOUSE_TAGS, namespaces
from lazyhippo_dagster.assets.metadata import OWNERS, llm_usage, preview
from lazyhippo_dagster.resources import GraphStoreResource, LazyhippoResource, LLMResource, ObjectStoreResource

_KINDS = store_kinds("duckdb", "sql", graph=True)


@dg.multi_asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS,
    specs=[dg.AssetSpec("entities", deps=["extractions"], kinds=_KINDS, owners=OWNERS,
                        description="Entities deduplicated by normalized name (dbt_like_sql/entities.sql)."),
           dg.AssetSpec("relations", deps=["extractions"], kinds=_KINDS, owners=OWNERS,
                        description="Weighted entity relations (dbt_like_sql/relations.sql)."),
           dg.AssetSpec("mentions", deps=["extractions"], kinds=_KINDS, owners=OWNERS,
                        description="Chunk-entity mentions (dbt_like_sql/mentions.sql)."),
           dg.AssetSpec("facts", deps=["extractions"], kinds={"duckdb", "sql"}, owners=OWNERS,
                        description="Sentences linked to the entities they name (dbt_like_sql/facts.sql).")],
    group_name="graph",
)
def entity_graph_tables(context: dg.AssetExecutionContext, lazyhippo: LazyhippoResource, graph_store: GraphStoreResource,
                        llm: LLMResource, object_store: ObjectStoreResource):
    """First drops the documents whose file vanished (their partitions are gone; nothing else removes them)."""
    settings = lazyhippo.settings()
    ns = [settings.namespace]
    with lazyhippo.warehouse() as con:
        vanished = drop_vanished(settings, con, graph_store.store, object_store.open(settings))
        counts = run_stage("entities", settings, con, graph_store.store, run_id=context.run.run_id, llm=llm.client(settings))
        top = preview(con, "SELECT name, type, mention_count, degree FROM entities WHERE namespace = ? "
                      "ORDER BY mention_count DESC, degree DESC, name LIMIT 15", ns, ["entity", "type", "mentions", "degree"])
        rels = preview(con, "SELECT a.name, b.name, r.weight, r.description FROM relations r "
                       "JOIN entities a ON a.namespace = r.namespace AND a.entity_id = r.source_id "
                       "JOIN entities b ON b.namespace = r.namespace AND b.entity_id = r.target_id "
                       "WHERE r.namespace = ? ORDER BY r.weight DESC, 1, 2 LIMIT 15", ns, ["source", "target", "weight", "description"])
    synced = {k: v for k, v in counts.figures().items() if k.startswith("graph_store_")}
    yield dg.MaterializeResult(asset_key="entities", metadata={"dagster/row_count": counts.entities, "top_entities": top, **synced,
                                                                "documents_vanished": len(vanished.doc_ids),
                                                                "entities_rebuilt": "all" if counts.scoped_entities is None
                                                                else counts.scoped_entities,
                                                                **llm_usage(counts.llm_usage)})
    yield dg.MaterializeResult(asset_key="relations", metadata={"dagster/row_count": counts.relations, "strongest": rels})
    yield dg.MaterializeResult(asset_key="mentions", metadata={"dagster/row_count": counts.mentions})
    yield dg.MaterializeResult(asset_key="facts", metadata={"dagster/row_count": counts.facts})
