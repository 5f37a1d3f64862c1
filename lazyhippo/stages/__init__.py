"""The indexing stages, one module per asset (documents ... exports), plus delete and merge (lifecycle).

Plain functions over the warehouse: the Dagster assets and library callers (`lazyhippo.index.run_index`) share them.
"""
