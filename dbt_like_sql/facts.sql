-- Facts: sentences that mention entities, linked to the (kept) normalized entity ids they name; a text as its
-- place in the chunk's text, as extracted_facts holds it (schema.sql).
WITH named AS (
    SELECT chunk_id, fact_idx, unnest(names) AS name
    FROM lh_facts WHERE namespace = $namespace
),
linked AS (
    SELECT chunk_id, fact_idx, list_sort(list(entity_id)) AS entity_ids FROM (
        SELECT DISTINCT n.chunk_id, n.fact_idx, e.entity_id
        FROM named n JOIN lh_names k ON k.name = n.name
        JOIN entities e ON e.namespace = $namespace AND e.entity_id = k.entity_id
        WHERE k.norm_name <> '')
    GROUP BY chunk_id, fact_idx
)
SELECT
    $namespace AS namespace,
    'f_' || substr(sha256(f.chunk_id || '#' || f.fact_idx), 1, 16) AS fact_id,
    f.chunk_id,
    f.span_start,
    f.span_length,
    f.text,
    coalesce(l.entity_ids, []::VARCHAR[]) AS entity_ids
FROM lh_facts f LEFT JOIN linked l USING (chunk_id, fact_idx)
WHERE f.namespace = $namespace
