"""The executor of the index jobs, picked when the definitions load: Dagster's own in-process or multiprocess
executor on one machine; in a cluster's processes (LAZYHIPPO_EXECUTOR=celery, see lazyhippo_dagster.cluster),
dagster-celery's executor, so a run launched from the cluster's UI, sensor or schedule is distributed without
extra config. The broker and backend are read from the environment by name: never in run config or code."""

from __future__ import annotations

import dagster as dg

from lazyhippo.settings import environment

CELERY_QUEUE_TAG = "dagster-celery/queue"
STEP_QUEUE = "dagster"  # dagster-celery's default queue: steps without a queue tag (the extraction batches)
BROKER, BACKEND = "LAZYHIPPO_CELERY_BROKER", "LAZYHIPPO_CELERY_BACKEND"


def index_executor(local: dg.ExecutorDefinition) -> dg.ExecutorDefinition:
    """`local` on one machine (`dg.multi_or_in_process_executor` or `dg.in_process_executor`); Celery in a
    cluster, steps tagged with a `dagster-celery/queue` going to that queue, the others to `dagster`."""
    if environment().executor != "celery":
        return local
    from dagster_celery import celery_executor

    return celery_executor.configured({"broker": {"env": BROKER}, "backend": {"env": BACKEND},
                                       "include": [], "config_source": celery_config(STEP_QUEUE)},
                                      name="lazyhippo_celery")


def celery_config(queue: str) -> dict:
    """Celery settings of the run worker and of the workers: a task whose worker process dies (kill -9, out of
    memory) goes back to the queue for another worker instead of failing the run."""
    return {"worker_prefetch_multiplier": 1, "task_default_priority": 5, "task_default_queue": queue,
            "task_acks_late": True, "task_reject_on_worker_lost": True,
            "broker_connection_retry_on_startup": True, "result_expires": 86400}


def celery_app_args(queue: str = STEP_QUEUE) -> dict:
    """The Celery app of the workers: Redis broker and backend from the environment."""
    env = environment()
    if not env.celery_broker or not env.celery_backend:
        raise ValueError(f"the Celery executor needs {BROKER} and {BACKEND} "
                         "(`lazyhippo cluster up` sets them from the services credentials)")
    return {"broker": env.celery_broker, "backend": env.celery_backend, "include": [],
            "config_source": celery_config(queue)}
