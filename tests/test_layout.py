"""The shape of the product: Dagster definitions that load into the expected asset graph, an engine that never
imports Dagster nor reads the environment outside its settings module, and no import cycle, lazy imports included."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import dagster as dg

import lazyhippo
import lazyhippo.sql
import lazyhippo_dagster

ENGINE = Path(lazyhippo.__file__).parent
PACKAGES = {"lazyhippo": ENGINE, "lazyhippo.sql": Path(lazyhippo.sql.__file__).parent,
            "lazyhippo_dagster": Path(lazyhippo_dagster.__file__).parent}
PACKAGES.update({f"lazyhippo_dagster.{sub}": Path(__import__(f"lazyhippo_dagster.{sub}", fromlist=["_"]).__file__).parent
                 for sub in ("assets", "resources")})


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            name = ".".join([pkg, *parts])
            if name.split(".")[:2] == ["lazyhippo", "sql"] and pkg == "lazyhippo":
                continue
            mods[name] = path
    return mods


def _imports(path: Path) -> set[str]:
    """Every module an import statement names, at any depth (function-level imports too)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_definitions_load_into_the_asset_graph_of_the_data_flow():
    from lazyhippo_dagster.definitions import defs

    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    flow = ["documents", "chunks", "extractions", "entities", "embeddings", "knn_edges", "communities",
            "community_summaries", "exports", "published_snapshot"]
    assert set(flow) | {"relations", "mentions", "facts"} <= keys
    for upstream, downstream in [("documents", "chunks"), ("chunks", "extractions"), ("extractions", "entities"),
                                 ("entities", "embeddings"), ("embeddings", "knn_edges"), ("knn_edges", "communities"),
                                 ("communities", "community_summaries"), ("exports", "published_snapshot"),
                                 ("community_summaries", "published_snapshot")]:
        parents = {k.to_user_string() for k in graph.get(dg.AssetKey(downstream)).parent_keys}
        assert upstream in parents, (upstream, downstream, parents)
    for key in keys:
        assert graph.get(dg.AssetKey(key)).kinds, f"{key} has no kinds tag"
    assert {"index", "index_graph", "rebuild_graph", "query"} <= {j.name for j in defs.resolve_all_job_defs()}
    assert defs.resolve_asset_graph().asset_check_keys, "the asset checks are part of the definitions"


def test_the_engine_never_imports_dagster():
    offenders = {name: sorted(i for i in _imports(path) if i.split(".")[0] in ("dagster", "lazyhippo_dagster"))
                 for name, path in _modules().items() if name.split(".")[0] == "lazyhippo"}
    assert not {k: v for k, v in offenders.items() if v}


def test_only_the_settings_module_reads_the_environment():
    """`environ.setdefault` is allowed: the server sets what its engine processes inherit, it reads nothing."""
    readers = {name for name, path in _modules().items()
               if name.startswith("lazyhippo.") and name != "lazyhippo.settings"
               and re.search(r"\bos\.environ\b(?!\.setdefault)|getenv", path.read_text())}
    assert not readers


def test_no_import_cycle_lazy_imports_included():
    mods = _modules()
    graph = {}
    for name, path in mods.items():
        deps = set()
        for imp in _imports(path):
            while imp and imp not in mods:
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                deps.add(imp)
        graph[name] = deps
    seen: dict[str, int] = {}  # 1 on the stack, 2 done

    def visit(node: str, stack: list[str]) -> None:
        seen[node] = 1
        for dep in sorted(graph[node]):
            if seen.get(dep) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(dep):] + [node, dep]))
            if dep not in seen:
                visit(dep, stack + [node])
        seen[node] = 2

    for name in sorted(graph):
        if name not in seen:
            visit(name, [])
