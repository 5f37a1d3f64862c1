"""Reindex when the source folder changes: the cursor is a fingerprint of (path, size, mtime) of its files."""

import hashlib
import json
from pathlib import Path

import dagster as dg

from lazyhippo.documents import iter_files
from resources import LazyhippoResource

from .jobs import index_job


def source_fingerprint(source: Path) -> str:
    entries = [(p.as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in iter_files(source)]
    return hashlib.sha256(json.dumps(entries).encode()).hexdigest()


@dg.sensor(job=index_job, minimum_interval_seconds=60, default_status=dg.DefaultSensorStatus.STOPPED,
           description="Reindex when files under the configured source are added, changed or deleted.")
def source_changed(context: dg.SensorEvaluationContext, lazyhippo: LazyhippoResource):
    source = Path(lazyhippo.settings().source)  # the folder the index job reads, from the same settings
    if not source.exists():
        return dg.SkipReason(f"source {source} does not exist")
    fingerprint = source_fingerprint(source)
    if fingerprint == context.cursor:
        return dg.SkipReason("no change in the source")
    context.update_cursor(fingerprint)
    return dg.RunRequest(run_key=fingerprint)
