"""lazyhippo engine: chunking, extraction, graph algorithms, retrieval and context assembly.

Pure Python; never imports Dagster, so it is usable as a library and testable alone.
"""

__version__ = "0.1.0"
