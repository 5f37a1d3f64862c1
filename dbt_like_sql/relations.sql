-- Relations between kept entities: one undirected row per pair, weights summed over chunks, the strongest
-- description kept; the type is the heaviest typed one the extractions gave the pair (RELATED_TO when none has a
-- type), `forward` when it reads from the lower id to the higher (RELATED_TO always does). Reads `entities` and
-- `lh_relations` (the extracted pairs each chunk keeps, with the entity ids of both ends: warehouse.chunk_relations),
-- which holds pairs of two distinct entities only.
-- Millions of pairs: descriptions are ranked in text order and aggregated as numbers, and each statement joins
-- once (see entities.sql). Rows come in description order: a relation's description is the sentence it was read
-- from, shared by every pair of that sentence, and DuckDB's dictionary compression only sees repeats within a
-- segment (in group order each sentence was stored again and again: relations were 3.7x larger). The pairs are
-- sorted by description rank before the descriptions join them, while the rows are narrow.
CREATE OR REPLACE TEMP TABLE lh_relation_texts AS  -- each distinct description with its place in text order
    SELECT description, row_number() OVER (ORDER BY description) AS r
    FROM (SELECT DISTINCT description FROM lh_relations WHERE description IS NOT NULL);

CREATE OR REPLACE TEMP TABLE lh_kept_relations AS  -- the extracted pairs of two kept entities
    SELECT r.source_id AS s, r.target_id AS t, least(r.source_id, r.target_id) AS lo,
           greatest(r.source_id, r.target_id) AS hi, r.chunk_id, r.weight, coalesce(r.type, 'RELATED_TO') AS type,
           x.r
    FROM lh_relations r LEFT JOIN lh_relation_texts x USING (description)
    WHERE r.source_id IN (SELECT entity_id FROM entities WHERE namespace = $namespace)
      AND r.target_id IN (SELECT entity_id FROM entities WHERE namespace = $namespace);

CREATE OR REPLACE TEMP TABLE lh_pair_rows AS  -- per pair and chunk, then per pair: n_chunks without a set per pair
    SELECT lo, hi, min(d) AS d, sum(weight) AS weight, count(*) AS n_chunks, min(f) AS f FROM (
        SELECT lo, hi, min((-weight, r)) AS d, sum(weight) AS weight,
               min((type = 'RELATED_TO', -weight, type, NOT (s < t))) AS f
        FROM lh_kept_relations GROUP BY lo, hi, chunk_id)
    GROUP BY lo, hi
    ORDER BY min(d)[2];  -- in description order (above)
DROP TABLE lh_kept_relations;

SELECT
    $namespace AS namespace,
    p.lo AS source_id,
    p.hi AS target_id,
    x.description,     -- the heaviest description, ties to the first in text order
    p.weight,
    p.n_chunks,
    p.f[3] AS type,    -- the heaviest typed one first
    p.f[1] OR NOT p.f[4] AS forward
FROM lh_pair_rows p LEFT JOIN lh_relation_texts x ON x.r = p.d[2]
