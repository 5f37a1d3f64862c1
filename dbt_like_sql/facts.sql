-- Facts: sentences that mention entities, linked to the normalized entity ids they name.
SELECT
    $namespace AS namespace,
    'f_' || substr(sha256(chunk_id || '#' || fact_idx), 1, 16) AS fact_id,
    chunk_id,
    text,
    list_distinct(list_transform(list_filter(names, lambda n: lh_norm(n) <> ''), lambda n: lh_entity_id(n))) AS entity_ids
FROM extracted_facts
WHERE namespace = $namespace
