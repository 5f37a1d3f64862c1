"""The executor of the index jobs: in-process, multiprocess or Celery, picked per run.

A run's config names one (`execution: {config: {celery: {}}}`); without it, a cluster's processes
(LAZYHIPPO_EXECUTOR=celery, see lazyhippo_dagster.cluster) send the steps to Celery workers and a single machine
uses the job's default. So the same definitions serve the embedded default and the cluster, and a run
launched from the cluster's UI, sensor or schedule is distributed without extra config."""

from __future__ import annotations

import dagster as dg
from dagster._core.definitions.executor_definition import (
    _core_in_process_executor_creation,
    _core_multiprocess_executor_creation,
    multiple_process_executor_requirements,
)
from dagster._core.execution.retries import RetryMode, get_retries_config

from lazyhippo.settings import environment

MULTIPROCESS = dg.multi_or_in_process_executor.config_schema.config_type.fields["multiprocess"].config_type
IN_PROCESS = dg.multi_or_in_process_executor.config_schema.config_type.fields["in_process"].config_type
# the broker and backend come from the process environment (LAZYHIPPO_CELERY_BROKER / _BACKEND): never in run config
CELERY = {"retries": get_retries_config()}
CELERY_QUEUE_TAG = "dagster-celery/queue"


def _chosen(config: dict, default: str) -> tuple[str, dict]:
    if config:
        return next(iter(config.items()))
    return ("celery" if environment().executor == "celery" else default), {}


def index_executor(default: str, queue: str) -> dg.ExecutorDefinition:
    """`default` ("multiprocess" or "in_process") on one machine; on Celery, steps without a
    `dagster-celery/queue` op tag go to `queue`."""

    def requirements(config: dict):
        kind, _ = _chosen(config or {}, default)
        return [] if kind == "in_process" else multiple_process_executor_requirements()

    @dg.executor(name=f"lazyhippo_{default}", requirements=requirements,
                 config_schema=dg.Field(dg.Selector({"multiprocess": MULTIPROCESS, "in_process": IN_PROCESS,
                                                     "celery": CELERY}), is_required=False))
    def _executor(init_context: dg.InitExecutorContext) -> dg.Executor:
        kind, config = _chosen(init_context.executor_config or {}, default)
        if kind == "celery":
            return celery_executor(queue, config)
        if kind == "multiprocess":
            return _core_multiprocess_executor_creation({**{"retries": {"enabled": {}}}, **config})
        return _core_in_process_executor_creation({**{"retries": {"enabled": {}}}, **config})

    return _executor


def celery_app_args(queue: str = "dagster") -> dict:
    """The Celery app of the run worker and of the workers: Redis broker and backend from the environment; a task
    whose worker process dies (kill -9, out of memory) goes back to the queue for another worker instead of
    failing the run."""
    env = environment()
    if not env.celery_broker or not env.celery_backend:
        raise ValueError("the Celery executor needs LAZYHIPPO_CELERY_BROKER and LAZYHIPPO_CELERY_BACKEND "
                         "(`lazyhippo cluster up` sets them from the services credentials)")
    return {"broker": env.celery_broker, "backend": env.celery_backend, "include": [],
            "config_source": {"worker_prefetch_multiplier": 1, "task_default_priority": 5,
                              "task_default_queue": queue, "task_acks_late": True, "task_reject_on_worker_lost": True,
                              "broker_connection_retry_on_startup": True, "result_expires": 86400}}


def celery_executor(queue: str, config: dict) -> dg.Executor:
    from dagster_celery.executor import CeleryExecutor

    args = celery_app_args(queue)
    retries = RetryMode.from_config(config.get("retries", {"enabled": {}}))
    return CeleryExecutor(broker=args["broker"], backend=args["backend"], include=args["include"],
                          config_source=args["config_source"], retries=retries)
