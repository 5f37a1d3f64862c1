"""Software-defined assets, one module per stage, named for what each produces."""

import warnings

import dagster as dg

from lazyhippo.settings import environment

if not environment().verbose:
    # a notice for who maintains these definitions (`--verbose`), not for every command that loads them:
    # the asset checks are partitioned by namespace (one check history per knowledge base), a preview feature
    warnings.filterwarnings("ignore", message="Specifying a partitions_def on an AssetCheckSpec", category=dg.PreviewWarning)
