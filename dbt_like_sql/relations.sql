-- Relations between kept entities: one undirected row per pair, weights summed over chunks, the strongest
-- description kept; the type is the heaviest typed one the extractions gave the pair (RELATED_TO when none has a
-- type), `forward` when it reads from the lower id to the higher (RELATED_TO always does). Reads `entities` and
-- `lh_relations` (the extracted pairs each chunk keeps: warehouse.chunk_relations), which holds pairs of two distinct
-- entities only: a `s <> t` here made DuckDB join the two name lookups first on that inequality (every name with
-- every other: 18 GB at 1,000 documents).
WITH raw AS (
    SELECT a.entity_id AS s, b.entity_id AS t, r.description, r.weight, r.chunk_id,
           coalesce(r.type, 'RELATED_TO') AS type
    FROM lh_relations r JOIN lh_names a ON a.name = r.source JOIN lh_names b ON b.name = r.target
),
kept AS (
    SELECT entity_id FROM entities WHERE namespace = $namespace
)
SELECT
    $namespace AS namespace,
    'r_' || substr(sha256(least(s, t) || '|' || greatest(s, t)), 1, 16) AS relation_id,
    least(s, t) AS source_id,
    greatest(s, t) AS target_id,
    arg_min(description, (-weight, description)) AS description,  -- not first(... ORDER BY): that holds every row
    sum(weight) AS weight,
    count(DISTINCT chunk_id) AS n_chunks,
    arg_min(type, (type = 'RELATED_TO', -weight, type)) AS type,
    arg_min(s < t OR type = 'RELATED_TO', (type = 'RELATED_TO', -weight, type, NOT (s < t))) AS forward
FROM raw
WHERE s IN (SELECT entity_id FROM kept) AND t IN (SELECT entity_id FROM kept)
GROUP BY least(s, t), greatest(s, t)
