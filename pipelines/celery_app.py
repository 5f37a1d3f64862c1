"""The Celery app the cluster's workers run (`celery -A lazyhippo_dagster.celery_app worker`): dagster-celery's
step task on the broker of LAZYHIPPO_CELERY_BROKER, configured here rather than in a file, so no worker config
holds the Redis password."""

from dagster_celery.make_app import make_app
from dagster_celery.tasks import create_task

from lazyhippo_dagster.executors import celery_app_args

app = make_app(celery_app_args())
execute_plan = create_task(app)
