"""Every indexing asset is partitioned by namespace (a dynamic partition per knowledge base), so one knowledge
base's runs, checks and history never mix with another's. LazyhippoResource reads the run's partition key
as its namespace; the CLI, the sensor and the schedule add the partition before they launch a run."""

import dagster as dg

namespaces = dg.DynamicPartitionsDefinition(name="namespaces")

# steps that open the DuckDB warehouse: one at a time within a run (the multiprocess executor's
# tag_concurrency_limits), while the extraction batches, which only touch the object store, run side by side
WAREHOUSE_TAGS = {"lazyhippo/warehouse": "1"}
