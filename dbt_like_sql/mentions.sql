-- Which chunk mentions which (kept) entity, and how often (sentences that name it, at least once).
WITH ents AS (
    SELECT x.chunk_id, k.entity_id
    FROM lh_entities x JOIN lh_names k ON k.name = x.name
    WHERE x.namespace = $namespace AND k.norm_name <> ''
      AND k.entity_id IN (SELECT entity_id FROM entities WHERE namespace = $namespace)
),
in_facts AS (
    SELECT f.chunk_id, k.entity_id
    FROM (SELECT chunk_id, unnest(names) AS name FROM lh_facts WHERE namespace = $namespace) f
    JOIN lh_names k ON k.name = f.name
)
SELECT $namespace AS namespace, e.chunk_id, e.entity_id, greatest(1, count(f.entity_id)) AS count
FROM (SELECT DISTINCT chunk_id, entity_id FROM ents) e
LEFT JOIN in_facts f ON f.chunk_id = e.chunk_id AND f.entity_id = e.entity_id
GROUP BY e.chunk_id, e.entity_id
