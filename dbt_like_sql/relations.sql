-- Relations between kept entities: one undirected row per pair, weights summed over chunks, the strongest
-- description kept. Reads `entities`.
WITH raw AS (
    SELECT lh_entity_id(source) AS s, lh_entity_id(target) AS t, description, weight, chunk_id
    FROM extracted_relations
    WHERE namespace = $namespace AND lh_norm(source) <> '' AND lh_norm(target) <> ''
),
kept AS (
    SELECT entity_id FROM entities WHERE namespace = $namespace
)
SELECT
    $namespace AS namespace,
    'r_' || substr(sha256(least(s, t) || '|' || greatest(s, t)), 1, 16) AS relation_id,
    least(s, t) AS source_id,
    greatest(s, t) AS target_id,
    first(description ORDER BY weight DESC, description) AS description,
    sum(weight) AS weight,
    count(DISTINCT chunk_id) AS n_chunks
FROM raw
WHERE s <> t AND s IN (SELECT entity_id FROM kept) AND t IN (SELECT entity_id FROM kept)
GROUP BY least(s, t), greatest(s, t)
