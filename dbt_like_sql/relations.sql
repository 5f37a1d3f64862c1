-- Relations between kept entities: one undirected row per pair, weights summed over chunks, the strongest
-- description kept; the type is the heaviest typed one the extractions gave the pair (RELATED_TO when none has a
-- type), `forward` when it reads from the lower id to the higher (RELATED_TO always does). Reads `entities` and
-- `lh_relations` (the extracted pairs each chunk keeps, with the entity ids of both ends: warehouse.chunk_relations),
-- which holds pairs of two distinct entities only.
-- Millions of pairs: descriptions are ranked in text order and aggregated as numbers, and each statement joins
-- once on texts (see entities.sql). A pair's description is mostly a reference to one of its chunk's facts
-- (`fact_idx`, schema.sql): the pairs join the places of the facts they refer to by chunk and index, not by text.
-- Rows come in description order: a relation's description is the sentence it was read from, shared by every pair
-- of that sentence, and DuckDB's dictionary compression only sees repeats within a segment (in group order each
-- sentence was stored again and again: relations were 3.7x larger). The pairs are sorted by description rank
-- before the descriptions join them, while the rows are narrow.
CREATE OR REPLACE TEMP TABLE lh_relation_facts AS  -- the facts descriptions refer to, with their description
    SELECT s.chunk_id, s.fact_idx, left(s.text, 300) AS description
    FROM lh_sentences s JOIN (SELECT DISTINCT chunk_id, fact_idx FROM lh_relations WHERE fact_idx IS NOT NULL) u
    USING (chunk_id, fact_idx);

CREATE OR REPLACE TEMP TABLE lh_relation_literals AS  -- the descriptions stored as text
    SELECT DISTINCT description FROM lh_relations WHERE fact_idx IS NULL AND description IS NOT NULL;

CREATE OR REPLACE TEMP TABLE lh_relation_texts AS  -- each distinct description with its place in text order
    SELECT description, row_number() OVER (ORDER BY description) AS r
    FROM (SELECT description FROM lh_relation_facts UNION SELECT description FROM lh_relation_literals);

CREATE OR REPLACE TEMP TABLE lh_relation_fact_ranks AS  -- a referred fact's place
    SELECT f.chunk_id, f.fact_idx, x.r FROM lh_relation_facts f JOIN lh_relation_texts x USING (description);
CREATE OR REPLACE TEMP TABLE lh_relation_literal_ranks AS  -- a text description's place
    SELECT x.description, x.r FROM lh_relation_texts x SEMI JOIN lh_relation_literals l USING (description);
DROP TABLE lh_relation_facts;
DROP TABLE lh_relation_literals;

CREATE OR REPLACE TEMP TABLE lh_kept_relations AS  -- the extracted pairs of two kept entities
    SELECT r.source_id AS s, r.target_id AS t, least(r.source_id, r.target_id) AS lo,
           greatest(r.source_id, r.target_id) AS hi, r.chunk_id, r.weight, coalesce(r.type, 'RELATED_TO') AS type,
           coalesce(f.r, x.r) AS r
    FROM lh_relations r LEFT JOIN lh_relation_fact_ranks f ON f.chunk_id = r.chunk_id AND f.fact_idx = r.fact_idx
    LEFT JOIN lh_relation_literal_ranks x ON r.fact_idx IS NULL AND x.description = r.description
    WHERE r.source_id IN (SELECT entity_id FROM entities WHERE namespace = $namespace)
      AND r.target_id IN (SELECT entity_id FROM entities WHERE namespace = $namespace);
DROP TABLE lh_relation_fact_ranks;
DROP TABLE lh_relation_literal_ranks;

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
