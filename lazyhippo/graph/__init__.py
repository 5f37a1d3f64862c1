"""Graph algorithms below both the graph stores and the query engine: KNN, communities, the passage graph, PPR."""
