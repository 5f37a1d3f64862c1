-- Entities deduplicated by normalized name. The most frequent surface form names the entity, a title
-- anywhere makes it a TITLE entity, up to three distinct descriptions are merged. Noun-phrase concepts
-- (type CONCEPT only) seen in a single chunk are pruned: they link nothing and would dominate the graph.
-- Every model reads `lh_names` (each extracted name with its normalized key and entity id, built once per run)
-- and the extracted rows in scope, `lh_entities`, `lh_relations` and `lh_facts`: the namespace's rows, or after a
-- small update those that name an entity the update touched (lazyhippo/stages/entities.py).
WITH raw AS (
    SELECT k.norm_name, x.name, x.type, x.description, x.chunk_id
    FROM lh_entities x JOIN lh_names k ON k.name = x.name
    WHERE x.namespace = $namespace AND k.norm_name <> ''
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
    HAVING NOT (bool_and(type = 'CONCEPT') AND count(DISTINCT chunk_id) < 2)
),
pairs AS (
    SELECT DISTINCT a.norm_name AS a, b.norm_name AS b
    FROM lh_relations r JOIN lh_names a ON a.name = r.source JOIN lh_names b ON b.name = r.target
),
deg AS (
    SELECT norm_name, count(DISTINCT other) AS degree FROM (
        SELECT a AS norm_name, b AS other FROM pairs UNION ALL SELECT b, a FROM pairs
    ) p
    WHERE p.norm_name <> p.other AND p.other IN (SELECT norm_name FROM agg)
    GROUP BY norm_name
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
FROM agg JOIN names USING (norm_name) LEFT JOIN deg USING (norm_name)
