"""Dagster resources: thin adapters from configuration to engine objects.

Nothing is read from the environment at import: an unset field (None) falls back to `Settings.from_env()`
when a run starts. The store resources hold one client per run (opened in `setup_for_execution`, closed in
`teardown_after_execution`); credentials come from the environment or the services credentials file.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Literal, Optional, get_args, get_origin, get_type_hints

import dagster as dg
import duckdb
from pydantic import PrivateAttr, create_model

from lazyhippo.settings import INSTANCE_HOME_FILE, GraphStoreKind, ObjectStoreKind, Settings, environment
from lazyhippo.settings import instance_home as home_of_instance_dir
from lazyhippo.stores import open_graph_store, open_object_store
from lazyhippo.stores.graphs import GraphStore
from lazyhippo.stores.namespaces import held_namespaces, namespace_settings, resolve_settings
from lazyhippo.stores.objects import ObjectStore
from lazyhippo.stores.warehouse import WriterSession
from lazyhippo_dagster.assets._partitions import NAMESPACE_TAG, PARTITION_TAG, namespaces  # NAMESPACE_TAG: on every run

HOME_FILE = INSTANCE_HOME_FILE


def instance_home(instance: dg.DagsterInstance) -> Path:
    """The index home an instance belongs to (`lazyhippo.settings.instance_home` of its folder)."""
    return home_of_instance_dir(instance.root_directory)


def _config_type(kind) -> type:
    """A Settings field's type as Dagster config: a path as text, a tuple as a list, a choice as its values' type."""
    args = [a for a in get_args(kind) if a is not type(None)]
    if get_origin(kind) is tuple:
        return list[args[0]]
    if get_origin(kind) is Literal:
        return type(args[0])
    if args:  # `X | None`
        return _config_type(args[0])
    return str if kind is Path else kind


STORE_FIELDS = ("graph_store", "object_store")  # configured on GraphStoreResource and ObjectStoreResource
# every other Settings field, unset by default: the Launchpad's config of a run, with nothing copied by hand
SettingsConfig = create_model("SettingsConfig", __base__=dg.ConfigurableResource, **{
    name: (Optional[_config_type(kind)], None) for name, kind in get_type_hints(Settings).items()
    if name not in STORE_FIELDS})


class LazyhippoResource(SettingsConfig):
    """Where the index lives, which knowledge base (namespace), and how each stage behaves: every field of
    `lazyhippo.settings.Settings` but the stores, unset by default. With `home` unset, a run acts on the home of
    its Dagster instance, on a namespace indexed there. Unset fields are resolved by
    `lazyhippo.stores.namespaces.resolve_settings`: the settings the namespace was last indexed with, else
    LAZYHIPPO_*, else `lazyhippo.settings.Settings`."""

    # benchmark asset checks (questions.json / themes.json beside the source are used when present)
    check_budget: int = 4000
    noise_share_max: float = 0.25
    theme_coverage_min: float = 0.9
    recall_at_5_min: float = 0.6
    _settings: Optional[Settings] = PrivateAttr(default=None)
    # the run's namespace: its partition key; None outside partitioned runs
    _partition: Optional[str] = PrivateAttr(default=None)
    _instance: Optional[dg.DagsterInstance] = PrivateAttr(default=None)

    def settings(self) -> Settings:
        """The run's Settings: filled once and reused by every asset. The partition key, when the run has one,
        is the namespace: one knowledge base per partition."""
        if self._settings is None:
            self._settings = self.settings_for(self._partition, self._instance)
        return self._settings

    def settings_for(self, namespace: Optional[str], instance: Optional[dg.DagsterInstance] = None) -> Settings:
        """Settings of `namespace` (else the configured one, else $LAZYHIPPO_NAMESPACE): this resource's config
        over `resolve_settings`. With `home` unset and an instance, the home is the instance's and the namespace
        must be one it holds (UnknownNamespace otherwise)."""
        given = {k: v for k, v in self._fields().items() if k not in ("home", "namespace")}
        namespace = namespace or self.namespace or Settings.from_env().namespace
        if self.home is None and environment().home is None and instance is not None and not instance.is_ephemeral:
            return namespace_settings(instance_home(instance), namespace, **given)
        return resolve_settings(self.home, namespace, **given)

    def _fields(self) -> dict:
        """This resource's settings fields (None where unset)."""
        return {k: getattr(self, k) for k in Settings.__dataclass_fields__ if hasattr(self, k)}

    def watched(self, instance: dg.DagsterInstance) -> list[Settings]:
        """Every namespace of the home (the instance's, unless `home` is set), plus the configured one.

        On a cluster the warehouse is the warehouse worker's, and the daemon that evaluates sensors and schedules
        holds none: there the namespaces are the instance's `namespaces` partitions, each with the settings its
        latest run named a source with (`cluster_namespaces`), compared against an empty baseline (its cursor
        aside): the warehouse steps skip the documents that did not change."""
        explicit = self.home or environment().home
        home = (Path(explicit).resolve() if explicit else Settings.from_env().home if instance.is_ephemeral
                else instance_home(instance))
        if on_cluster():
            known = cluster_namespaces(instance)
            out = [Settings.from_env(**{**self._fields(), **config, "home": home, "namespace": ns})
                   for ns, config in known.items()]
        else:
            known = held_namespaces(home)
            out = [self.settings_for(n, instance) for n in known]
        # the configured namespace (named, or the default one of a configured source) is watched before its
        # first index too: the sensor may create it
        configured = self.namespace or (Settings.from_env().namespace if self.source else None)
        if configured and configured not in known:
            given = {k: v for k, v in self._fields().items() if k not in ("home", "namespace")}
            out.append(resolve_settings(home, configured, **given))
        return out

    def run_config(self, settings: Settings) -> dict:
        """The run config a sensor or schedule gives a run of `settings` on a cluster: its namespace, source and
        other settings, for the workers, which know nothing else of them (on one machine: none, a run reads the
        settings its namespace was indexed with from the home)."""
        if not on_cluster():
            return {}
        defaults = Settings()
        config = {k: list(v) if isinstance(v, tuple) else v for k in self._fields() if k != "home"
                  for v in [getattr(settings, k)] if k in ("namespace", "source") or v != getattr(defaults, k)}
        return {"resources": {"lazyhippo": {"config": config}}}

    _writer: Optional[WriterSession] = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        """One writer lock per step process (per run on the in-process executor): the first stage that writes
        waits for the home's lock. Readers see nothing of it until the run's `published_snapshot` step, which
        runs after every other (a query run never locks)."""
        self._settings = None  # filled once per run, on first use, with the run's partition as namespace
        tags = context.run.tags if context.run is not None else {}
        self._partition = tags.get(PARTITION_TAG)
        self._instance = context.instance
        if context.run is None:  # a sensor or schedule evaluation: it names its namespaces itself
            return
        settings = self.settings()  # a namespace the instance's home does not hold fails here, before any step
        if tags.get(NAMESPACE_TAG) != settings.namespace and context.instance is not None:
            context.instance.add_run_tags(context.run.run_id, {NAMESPACE_TAG: settings.namespace})
        log = context.log.info if context.log else None
        self._writer = WriterSession(settings, context.run.run_id, on_wait=log)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._writer is not None:
            self._writer.finish(success=not _run_failed(context), publish_now=False)
            self._writer = None

    @contextmanager
    def _session(self) -> Iterator[WriterSession]:
        writer = self._writer or WriterSession(self.settings(), "adhoc")
        try:
            yield writer
        finally:
            if writer is not self._writer:  # used outside a run: its own short hold of the lock
                writer.finish(success=True)

    @contextmanager
    def warehouse(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self._session() as writer, writer.connect() as con:
            yield con

    def read_work(self) -> None:
        """Let this step's queries read the run's own rows, which are not published before its last step (on
        the multiprocess and Celery executors a step process reads the published snapshot otherwise)."""
        if self._writer is not None:
            self._writer.acquire()

    def publish(self) -> Path:
        """Publish the namespace as the run left it: the local snapshot readers open, and with LAZYHIPPO_SNAPSHOTS
        a new version in the object store for `serve --snapshots` replicas."""
        with self._session() as writer:
            return writer.publish()


class GraphStoreResource(dg.ConfigurableResource):
    """`embedded` (DuckDB + in-process algorithms) or `neo4j` (Bolt + GDS): one store per run.
    Unset: LAZYHIPPO_GRAPH_STORE, NEO4J_URI / NEO4J_USER / NEO4J_PASSWORD, else the services credentials file."""

    kind: Optional[GraphStoreKind] = None
    neo4j_uri: Optional[str] = None
    neo4j_user: Optional[str] = None
    neo4j_password: Optional[str] = None
    _store: Optional[GraphStore] = PrivateAttr(default=None)

    @property
    def resolved_kind(self) -> str:
        return GraphStoreKind(self.kind or Settings.from_env().graph_store).value

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        self._store = open_graph_store(self.resolved_kind, uri=self.neo4j_uri, user=self.neo4j_user,
                                       password=self.neo4j_password)

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None

    @property
    def store(self) -> GraphStore:
        """The run's store (opened on first use when the resource is invoked directly, outside a run)."""
        if self._store is None:
            self.setup_for_execution(None)
        return self._store


class ObjectStoreResource(dg.ConfigurableResource):
    """`local` (a folder under the index home) or `minio` (S3-compatible): one client per run.
    Unset: LAZYHIPPO_OBJECT_STORE, MINIO_ENDPOINT / MINIO_BUCKET / MINIO_ROOT_USER / MINIO_ROOT_PASSWORD,
    else the services credentials file."""

    kind: Optional[ObjectStoreKind] = None
    root: Optional[str] = None
    endpoint: Optional[str] = None
    bucket: Optional[str] = None
    access_key: Optional[str] = None
    secret_key: Optional[str] = None

    def open(self, settings: Settings) -> ObjectStore:
        return open_object_store(ObjectStoreKind(self.kind or settings.object_store).value, settings, root=self.root, endpoint=self.endpoint,
                                 bucket=self.bucket, access_key=self.access_key, secret_key=self.secret_key)


class LLMResource(dg.ConfigurableResource):
    """The OpenAI-compatible endpoint `settings.llm` selects (base URL, key and model from the environment
    unless set here). One client (retry policy, concurrency bound, token meter) per run; None when the
    settings choose no LLM, which keeps every stage offline."""

    base_url: Optional[str] = None
    api_key: Optional[str] = None
    model: Optional[str] = None
    timeout: float = 120.0
    max_retries: int = 4
    concurrency: int = 2
    _clients: dict = PrivateAttr(default_factory=dict)

    def client(self, settings: Settings):
        from dataclasses import replace

        from lazyhippo.models.llm import LLMConfig, OpenAIChat

        if settings.llm != "openai":
            return None
        model = self.model or settings.llm_model
        if model not in self._clients:
            cfg = LLMConfig.from_env(model, timeout=self.timeout, max_retries=self.max_retries,
                                     concurrency=self.concurrency)
            cfg = replace(cfg, **{k: v for k, v in (("base_url", self.base_url), ("api_key", self.api_key)) if v})
            self._clients[model] = OpenAIChat(cfg)
        return self._clients[model]


STEP_OUTPUTS = "dagster/"  # prefix of the step outputs in a shared object store
STEP_OUTPUTS_DAYS = 7     # a failed run's outputs are kept this long, for its re-execution from failure


def step_output_store(object_store: ObjectStoreResource) -> Optional[ObjectStore]:
    """The shared object store that holds step outputs, or None with the local one (Dagster's own pickles)."""
    settings = Settings.from_env()
    if ObjectStoreKind(object_store.kind or settings.object_store) == ObjectStoreKind.local:
        return None
    return object_store.open(settings)


def remove_run_outputs(instance: dg.DagsterInstance, run_id: str, object_store: ObjectStoreResource) -> int:
    """What a successful run's steps handed each other (the extraction batches' results among them): its
    objects under `dagster/<run_id>/` in a shared store, else its step folders of Dagster's pickles (the run's
    compute logs stay). Returns how many were removed."""
    store = step_output_store(object_store)
    if store is not None:
        return store.delete_prefix(ObjectStoreIOManager.run_prefix(run_id))
    import shutil

    folder = Path(instance.storage_directory()) / run_id
    steps = [p for p in folder.iterdir() if p.is_dir() and p.name != "compute_logs"] if folder.is_dir() else []
    for step in steps:
        shutil.rmtree(step, ignore_errors=True)
    return len(steps)


class StepOutputsIOManager(dg.ConfigurableIOManagerFactory):
    """Where steps hand each other their (small) outputs: with a shared object store (MinIO/S3), pickles in it
    under `dagster/<run_id>/<step>/<output>`, so a step on one worker reads what a step on another wrote
    (expired by the bucket unless removed); with the local one, Dagster's own pickles under the instance's
    storage folder, as by default. Both are removed when the run succeeds (`remove_run_outputs`)."""

    object_store: ObjectStoreResource

    def create_io_manager(self, context: dg.InitResourceContext) -> dg.IOManager:
        store = step_output_store(self.object_store)
        if store is None:
            return dg.FilesystemIOManager(base_dir=context.instance.storage_directory()).create_io_manager(context)
        return ObjectStoreIOManager(store)


class ObjectStoreIOManager(dg.IOManager):
    def __init__(self, store: ObjectStore):
        self.store = store

    @staticmethod
    def run_prefix(run_id: str) -> str:
        return f"{STEP_OUTPUTS}{run_id}/"

    @staticmethod
    def _key(context: dg.OutputContext) -> str:
        return STEP_OUTPUTS + "/".join(context.get_identifier())

    def handle_output(self, context: dg.OutputContext, obj) -> None:
        import pickle

        self.store.put(self._key(context), pickle.dumps(obj))

    def load_input(self, context: dg.InputContext):
        import pickle

        return pickle.loads(self.store.get(self._key(context.upstream_output)))


def on_cluster() -> bool:
    """A cluster's process (LAZYHIPPO_EXECUTOR=celery, see lazyhippo_dagster.cluster): the warehouse is elsewhere."""
    return environment().executor == "celery"


def lazyhippo_config(run: dg.DagsterRun) -> dict:
    """The `lazyhippo` resource config a run was launched with ({} when none)."""
    return ((run.run_config or {}).get("resources") or {}).get("lazyhippo", {}).get("config") or {}


def cluster_namespaces(instance: dg.DagsterInstance, runs_per_namespace: int = 20) -> dict[str, dict]:
    """namespace -> the settings fields of its latest run that named a source, for every namespace partition of
    the instance (shared by every host of a cluster); a namespace none of whose recent runs did is left out."""
    out = {}
    for ns in instance.get_dynamic_partitions(namespaces.name):
        for run in instance.get_runs(dg.RunsFilter(tags={NAMESPACE_TAG: ns}), limit=runs_per_namespace):
            config = lazyhippo_config(run)
            if config.get("source"):
                out[ns] = {k: v for k, v in config.items() if k in Settings.__dataclass_fields__ and k != "home"}
                break
    return out


def _run_failed(context: dg.InitResourceContext) -> bool:
    if context.instance is None or context.run is None:
        return False
    return bool(context.instance.all_logs(context.run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE))


def default_resources() -> dict:
    object_store = ObjectStoreResource()
    return {"lazyhippo": LazyhippoResource(), "graph_store": GraphStoreResource(), "object_store": object_store,
            "llm": LLMResource(), "io_manager": StepOutputsIOManager(object_store=object_store)}
