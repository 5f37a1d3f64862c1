"""Query engine: local (HippoRAG 2 PPR), global (communities), drift, hybrid (RRF) and auto routes over an
in-memory GraphIndex loaded once per warehouse version. Pure Python: no Dagster imports."""
