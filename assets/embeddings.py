import dagster as dg

from lazyhippo.index import build_embeddings
from resources import LazyhippoResource

from ._meta import scalars
from ._partitions import WAREHOUSE_TAGS, namespaces


@dg.asset(partitions_def=namespaces, op_tags=WAREHOUSE_TAGS, deps=["chunks", "entities", "facts"], group_name="graph",
          description="Chunk, entity and fact vectors; only new or changed items are embedded again.")
def embeddings(lazyhippo: LazyhippoResource) -> dg.MaterializeResult:
    with lazyhippo.warehouse() as con:
        stats = build_embeddings(lazyhippo.settings(), con)
    return dg.MaterializeResult(metadata={**scalars(stats), "dagster/row_count": stats["chunks"] + stats["entities"] + stats["facts"]})
