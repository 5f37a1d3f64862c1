"""The knowledge bases a home holds, each with the settings it was indexed with (its source first).

An index records its namespace here, so whatever knows only the home (the Dagster UI, its sensors and schedules,
whose instance lives at `<home>/dagster`) acts on the same source with the same settings, and can tell a
namespace the home does not hold from one it does."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from lazyhippo.settings import QUERY_FIELDS, Settings, check_namespace

FOLDER = "namespaces"


class UnknownNamespace(LookupError):
    """A namespace the home holds no index of."""


def _path(home: Path, namespace: str) -> Path:
    return Path(home) / FOLDER / f"{check_namespace(namespace)}.json"


# never recorded: what a run says for itself, and what the deployment decides at each run (whether and which LLM
# answers and summarizes, query-time choices): a namespace indexed without an LLM is answered by one once configured
PER_RUN = ("home", "namespace", "mode", "llm", "llm_model", *QUERY_FIELDS)


def record_namespace(settings: Settings) -> None:
    """Remember how `settings.namespace` is indexed (everything but its home, name and the run's mode); atomic."""
    path = _path(settings.home, settings.namespace)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {k: v for k, v in asdict(settings).items() if k not in PER_RUN}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(values, sort_keys=True, default=str))
    os.replace(tmp, path)


def held_namespaces(home: Path) -> list[str]:
    """The namespaces indexed into `home`, sorted."""
    folder = Path(home) / FOLDER
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def resolve_settings(home: Path | str | None, namespace: str | None, **given) -> Settings:
    """The settings of one run, the one resolver every entry point calls (CLI, Dagster resource, sensors,
    schedules, HTTP runs through the CLI): defaults, then LAZYHIPPO_* variables, then what the namespace was last
    indexed with (when the home holds it), then `given`, the run's explicit choices (None values ignored). So a
    setting a re-index changes (`--community-algorithm louvain`) is recorded and kept by every later run."""
    base = Settings.from_env(home=home, namespace=namespace)
    path = _path(base.home, base.namespace)
    known = set(Settings.__dataclass_fields__) - set(PER_RUN)
    recorded = {k: v for k, v in json.loads(path.read_text()).items() if k in known} if path.exists() else {}
    return base.with_(**recorded).with_(**given)


def namespace_settings(home: Path, namespace: str, **given) -> Settings:
    """`resolve_settings` for a namespace the home must hold: UnknownNamespace otherwise."""
    if not _path(home, namespace).exists():
        held = ", ".join(held_namespaces(home)) or "none"
        raise UnknownNamespace(f"namespace {namespace!r} is not indexed in {Path(home)} (it holds: {held}); "
                               f"index it first: lazyhippo index <folder> --home {Path(home)} -n {namespace}")
    return resolve_settings(home, namespace, **given)
