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
    SELECT norm_name, arg_min(name, (-n, name)) AS name FROM forms GROUP BY norm_name
),
types AS (  -- the most frequent type, ties to the first in order
    SELECT norm_name, arg_min(type, (-n, type)) AS type FROM (
        SELECT norm_name, type, count(*) AS n FROM raw WHERE type IS NOT NULL GROUP BY norm_name, type) GROUP BY norm_name
),
descriptions AS (  -- the first three distinct descriptions in order
    SELECT norm_name, array_to_string(min(description, 3), ' | ') AS description FROM (
        SELECT DISTINCT norm_name, description FROM raw) GROUP BY norm_name
),
spread AS (  -- chunks per name (not count(DISTINCT): it holds a set per group, unspilled)
    SELECT norm_name, count(*) AS n_chunks FROM (SELECT DISTINCT norm_name, chunk_id FROM raw) GROUP BY norm_name
),
agg AS (  -- (aggregates that keep one value per name: an ordered aggregate holds all of a group's rows, unspilled)
    SELECT
        norm_name,
        CASE WHEN bool_or(raw.type = 'TITLE') THEN 'TITLE' ELSE any_value(types.type) END AS type,
        any_value(descriptions.description) AS description,
        count(*) AS mention_count
    FROM raw LEFT JOIN types USING (norm_name) JOIN descriptions USING (norm_name) JOIN spread USING (norm_name)
    GROUP BY norm_name
    HAVING NOT (bool_and(raw.type = 'CONCEPT') AND any_value(spread.n_chunks) < 2)
),
pairs AS (  -- each pair of two kept names once, lower name first: one distinct over the pairs, no set per name
    SELECT DISTINCT least(a.norm_name, b.norm_name) AS lo, greatest(a.norm_name, b.norm_name) AS hi
    FROM lh_relations r JOIN lh_names a ON a.name = r.source JOIN lh_names b ON b.name = r.target
    WHERE a.norm_name <> b.norm_name
      AND a.norm_name IN (SELECT norm_name FROM agg) AND b.norm_name IN (SELECT norm_name FROM agg)
),
deg AS (
    SELECT norm_name, count(*) AS degree FROM (SELECT lo AS norm_name FROM pairs UNION ALL SELECT hi FROM pairs)
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
