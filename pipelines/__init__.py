"""The Dagster project over the lazyhippo engine: definitions, assets and checks, resources, jobs, sensors,
schedules and the `lazyhippo` CLI. Everything here is a thin adapter; the logic lives in `lazyhippo`."""
