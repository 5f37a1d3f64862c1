"""Software-defined assets, one module per stage, named for what each produces."""

import warnings

import dagster as dg

from lazyhippo.settings import environment

if not environment().verbose:
    # the per-document assets run a backfill as one run (BackfillPolicy.single_run), a parameter Dagster marks as
    # beta: a notice for who maintains these definitions (`--verbose`), not for every command that loads them
    warnings.filterwarnings("ignore", message="Parameter `backfill_policy`", category=dg.BetaWarning)
    # the asset checks are partitioned by namespace (one check history per knowledge base), a preview feature
    warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning)
