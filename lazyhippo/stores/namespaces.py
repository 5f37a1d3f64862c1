"""The knowledge bases a home holds, each with the settings it was indexed with (its source first).

An index records its namespace here, so whatever knows only the home (the Dagster UI, its sensors and schedules,
whose instance lives at `<home>/dagster`) acts on the same source with the same settings, and can tell a
namespace the home does not hold from one it does."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path

from lazyhippo.settings import Settings, check_namespace

FOLDER = "namespaces"


class UnknownNamespace(LookupError):
    """A namespace the home holds no index of."""


def _path(home: Path, namespace: str) -> Path:
    return Path(home) / FOLDER / f"{check_namespace(namespace)}.json"


def record_namespace(settings: Settings) -> None:
    """Remember how `settings.namespace` is indexed (everything but its home and name); atomic."""
    path = _path(settings.home, settings.namespace)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = {k: v for k, v in asdict(settings).items() if k not in ("home", "namespace")}
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(values, sort_keys=True, default=str))
    os.replace(tmp, path)


def held_namespaces(home: Path) -> list[str]:
    """The namespaces indexed into `home`, sorted."""
    folder = Path(home) / FOLDER
    return sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []


def namespace_settings(home: Path, namespace: str, **overrides) -> Settings:
    """The settings `namespace` was indexed with, then `overrides` (None values ignored); UnknownNamespace
    when the home holds no such namespace."""
    path = _path(home, namespace)
    if not path.exists():
        held = ", ".join(held_namespaces(home)) or "none"
        raise UnknownNamespace(f"namespace {namespace!r} is not indexed in {Path(home)} (it holds: {held}); "
                               f"index it first: lazyhippo index <folder> --home {Path(home)} -n {namespace}")
    recorded = json.loads(path.read_text())
    known = set(Settings.__dataclass_fields__)
    return Settings().with_(home=home, namespace=namespace, **{k: v for k, v in recorded.items() if k in known}).with_(**overrides)
