-- Entities deduplicated by normalized name. The most frequent surface form names the entity, a title
-- anywhere makes it a TITLE entity, up to three distinct descriptions are merged. Reads `relations`.
WITH raw AS (
    SELECT lh_norm(name) AS norm_name, name, type, description
    FROM extracted_entities
    WHERE namespace = $namespace AND lh_norm(name) <> ''
),
forms AS (
    SELECT norm_name, name, count(*) AS n FROM raw GROUP BY norm_name, name
),
names AS (
    SELECT norm_name, first(name ORDER BY n DESC, name) AS name FROM forms GROUP BY norm_name
),
agg AS (
    SELECT
        norm_name,
        CASE WHEN bool_or(type = 'TITLE') THEN 'TITLE' ELSE mode(type ORDER BY type) END AS type,
        array_to_string(list_slice(list(DISTINCT description ORDER BY description), 1, 3), ' | ') AS description,
        count(*) AS mention_count
    FROM raw GROUP BY norm_name
),
deg AS (
    SELECT id, count(*) AS degree FROM (
        SELECT source_id AS id FROM relations WHERE namespace = $namespace
        UNION ALL
        SELECT target_id FROM relations WHERE namespace = $namespace
    ) GROUP BY id
)
SELECT
    $namespace AS namespace,
    'e_' || substr(sha256(agg.norm_name), 1, 16) AS entity_id,
    names.name,
    agg.norm_name,
    agg.type,
    agg.description,
    agg.mention_count,
    coalesce(deg.degree, 0) AS degree
FROM agg JOIN names USING (norm_name) LEFT JOIN deg ON deg.id = 'e_' || substr(sha256(agg.norm_name), 1, 16)
