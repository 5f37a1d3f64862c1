-- Which chunk mentions which (kept) entity, and how often (sentences that name it, at least once).
WITH ents AS (
    SELECT chunk_id, lh_entity_id(name) AS entity_id
    FROM extracted_entities WHERE namespace = $namespace AND lh_norm(name) <> ''
      AND lh_entity_id(name) IN (SELECT entity_id FROM entities WHERE namespace = $namespace)
),
in_facts AS (
    SELECT chunk_id, lh_entity_id(unnest(names)) AS entity_id
    FROM extracted_facts WHERE namespace = $namespace
)
SELECT $namespace AS namespace, e.chunk_id, e.entity_id, greatest(1, count(f.entity_id)) AS count
FROM (SELECT DISTINCT chunk_id, entity_id FROM ents) e
LEFT JOIN in_facts f ON f.chunk_id = e.chunk_id AND f.entity_id = e.entity_id
GROUP BY e.chunk_id, e.entity_id
