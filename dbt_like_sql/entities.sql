-- Entities deduplicated by normalized name. The most frequent surface form names the entity, a title
-- anywhere makes it a TITLE entity, up to three distinct descriptions are merged. Noun-phrase concepts
-- (type CONCEPT only) seen in a single chunk are pruned: they link nothing and would dominate the graph.
-- Every model reads `lh_names` (each extracted name with its normalized key and entity id, built once per run)
-- and the extracted rows in scope, `lh_entities`, `lh_relations` and `lh_facts`: the namespace's rows, or after a
-- small update those that name an entity the update touched (lazyhippo/stages/entities.py); and `lh_sentences`,
-- every fact of the namespace, whose starts are most descriptions (schema.sql).
-- Millions of names: every aggregate keeps a number or one short value per name (an ordered aggregate, a set or
-- a text per group stays in memory, where sorts and joins spill to disk), and the temporary tables before the
-- model's SELECT keep each statement to one join on texts.
CREATE OR REPLACE TEMP VIEW lh_raw AS  -- a description: a fact of the chunk (`fact_idx`) or text (schema.sql)
    SELECT k.norm_name, x.name, x.type, x.fact_idx, x.description, x.chunk_id
    FROM lh_entities x JOIN lh_names k ON k.name = x.name
    WHERE k.norm_name <> '';

CREATE OR REPLACE TEMP TABLE lh_kept AS  -- each kept name, its surface form, type and mention count
    WITH forms AS (
        SELECT norm_name, name, count(*) AS n FROM lh_raw GROUP BY norm_name, name
    ),
    names AS (
        SELECT norm_name, arg_min(name, (-n, name)) AS name FROM forms GROUP BY norm_name
    ),
    types AS (  -- the most frequent type, ties to the first in order
        SELECT norm_name, arg_min(type, (-n, type)) AS type FROM (
            SELECT norm_name, type, count(*) AS n FROM lh_raw WHERE type IS NOT NULL GROUP BY norm_name, type)
        GROUP BY norm_name
    ),
    spread AS (  -- chunks per name
        SELECT norm_name, count(*) AS n_chunks FROM (SELECT DISTINCT norm_name, chunk_id FROM lh_raw) GROUP BY norm_name
    ),
    agg AS (
        SELECT norm_name, bool_or(type = 'TITLE') AS title, bool_and(type = 'CONCEPT') AS concept,
               count(*) AS mention_count
        FROM lh_raw GROUP BY norm_name
    )
    SELECT 'e_' || substr(sha256(agg.norm_name), 1, 16) AS entity_id, agg.norm_name, names.name,
           CASE WHEN agg.title THEN 'TITLE' ELSE types.type END AS type, agg.mention_count
    FROM agg JOIN spread USING (norm_name) JOIN names USING (norm_name) LEFT JOIN types USING (norm_name)
    WHERE NOT (agg.concept AND spread.n_chunks < 2);

CREATE OR REPLACE TEMP TABLE lh_pairs AS  -- each pair of kept entities related in a chunk once, lower id first
    SELECT DISTINCT least(source_id, target_id) AS lo, greatest(source_id, target_id) AS hi FROM lh_relations
    WHERE source_id IN (SELECT entity_id FROM lh_kept) AND target_id IN (SELECT entity_id FROM lh_kept);

CREATE OR REPLACE TEMP TABLE lh_degrees AS  -- kept names with their number of kept neighbours
    SELECT k.*, coalesce(d.degree, 0) AS degree FROM lh_kept k LEFT JOIN (
        SELECT entity_id, count(*) AS degree
        FROM (SELECT lo AS entity_id FROM lh_pairs UNION ALL SELECT hi FROM lh_pairs)
        GROUP BY entity_id) d USING (entity_id);
DROP TABLE lh_pairs;

CREATE OR REPLACE TEMP TABLE lh_entity_facts AS  -- the facts descriptions refer to, with their description
    SELECT s.chunk_id, s.fact_idx, left(s.text, 300) AS description
    FROM lh_sentences s JOIN (SELECT DISTINCT chunk_id, fact_idx FROM lh_entities WHERE fact_idx IS NOT NULL) u
    USING (chunk_id, fact_idx);

CREATE OR REPLACE TEMP TABLE lh_entity_literals AS  -- the descriptions stored as text
    SELECT DISTINCT description FROM lh_entities WHERE fact_idx IS NULL AND description IS NOT NULL;

CREATE OR REPLACE TEMP TABLE lh_texts AS  -- each distinct description with its place in text order
    SELECT description, row_number() OVER (ORDER BY description) AS r
    FROM (SELECT description FROM lh_entity_facts UNION SELECT description FROM lh_entity_literals);

CREATE OR REPLACE TEMP TABLE lh_fact_ranks AS  -- a referred fact's place
    SELECT f.chunk_id, f.fact_idx, x.r FROM lh_entity_facts f JOIN lh_texts x USING (description);
CREATE OR REPLACE TEMP TABLE lh_literal_ranks AS  -- a text description's place
    SELECT x.description, x.r FROM lh_texts x SEMI JOIN lh_entity_literals l USING (description);
DROP TABLE lh_entity_facts;
DROP TABLE lh_entity_literals;

CREATE OR REPLACE TEMP TABLE lh_name_ranks AS  -- the places of each kept name's descriptions
    SELECT DISTINCT x.norm_name, f.r FROM lh_raw x JOIN lh_fact_ranks f USING (chunk_id, fact_idx)
    WHERE x.norm_name IN (SELECT norm_name FROM lh_kept);
INSERT INTO lh_name_ranks
    SELECT DISTINCT x.norm_name, l.r FROM lh_raw x JOIN lh_literal_ranks l USING (description)
    WHERE x.fact_idx IS NULL AND x.norm_name IN (SELECT norm_name FROM lh_kept);
DROP TABLE lh_fact_ranks;
DROP TABLE lh_literal_ranks;

CREATE OR REPLACE TEMP TABLE lh_first AS  -- a kept name's first description, with the places of its first three
    SELECT f.norm_name, f.rs, t.description FROM (
        SELECT norm_name, min(r, 3) AS rs FROM (SELECT DISTINCT norm_name, r FROM lh_name_ranks) GROUP BY norm_name) f
    JOIN lh_texts t ON t.r = f.rs[1];
DROP TABLE lh_name_ranks;

CREATE OR REPLACE TEMP TABLE lh_second AS
    SELECT f.norm_name, f.rs, concat_ws(' | ', f.description, t.description) AS description
    FROM lh_first f LEFT JOIN lh_texts t ON t.r = f.rs[2];
DROP TABLE lh_first;

CREATE OR REPLACE TEMP TABLE lh_described AS
    SELECT f.norm_name, concat_ws(' | ', f.description, t.description) AS description
    FROM lh_second f LEFT JOIN lh_texts t ON t.r = f.rs[3];
DROP TABLE lh_second;
DROP TABLE lh_texts;

SELECT
    $namespace AS namespace,
    k.entity_id,
    k.name,
    k.norm_name,
    k.type,
    d.description,
    k.mention_count,
    k.degree
FROM lh_degrees k LEFT JOIN lh_described d USING (norm_name)
