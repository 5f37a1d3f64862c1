"""Stable import path for the query engine (the implementation lives in `lazyhippo.query`)."""

from .query import *  # noqa: F401,F403
from .query import __all__  # noqa: F401
