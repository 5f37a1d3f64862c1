-- Warehouse tables. Every row carries a namespace so one deployment holds several knowledge bases.
-- Long text columns are stored with zstd (`USING COMPRESSION zstd`): DuckDB's own choice (dictionary, FSST) stored a
-- document's sections uncompressed and shortened passages, sentences and merged descriptions by a third at best;
-- zstd takes 18.2 -> 5.3 MB of documents and 32 MB in all off the warehouse at 10,000 documents. Tables written
-- before are rewritten once on open (lazyhippo.stores.warehouse._migrate_compression).
CREATE TABLE IF NOT EXISTS documents (
  namespace VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, source VARCHAR NOT NULL, title VARCHAR,
  kind VARCHAR, content_hash VARCHAR NOT NULL, n_chars BIGINT, sections VARCHAR NOT NULL USING COMPRESSION zstd,
  PRIMARY KEY (namespace, doc_id));
-- Documents removed by `lazyhippo delete`: skipped by later ingests while their content is unchanged.
CREATE TABLE IF NOT EXISTS deleted_documents (
  namespace VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, source VARCHAR NOT NULL, content_hash VARCHAR NOT NULL,
  deleted_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (namespace, doc_id));
-- Entity merges (`lazyhippo merge`) by normalized name, folded in after every rebuild of the graph tables.
CREATE TABLE IF NOT EXISTS entity_merges (
  namespace VARCHAR NOT NULL, source_norm VARCHAR NOT NULL, target_norm VARCHAR NOT NULL, strategy VARCHAR NOT NULL,
  seq BIGINT NOT NULL, merged_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (namespace, seq, source_norm));
-- the name a merge gives its target when no entity had it yet (NULL: the target existed)
ALTER TABLE entity_merges ADD COLUMN IF NOT EXISTS target_name VARCHAR;
CREATE TABLE IF NOT EXISTS document_errors (
  namespace VARCHAR NOT NULL, source VARCHAR NOT NULL, reason VARCHAR NOT NULL,
  PRIMARY KEY (namespace, source));
CREATE TABLE IF NOT EXISTS chunks (
  namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, title VARCHAR,
  position INTEGER NOT NULL, section VARCHAR, page INTEGER, text VARCHAR NOT NULL USING COMPRESSION zstd,
  content_hash VARCHAR NOT NULL, n_tokens INTEGER NOT NULL,
  PRIMARY KEY (namespace, chunk_id));
-- A description that is the start of one of the chunk's sentences (its first 300 characters, or all of it: what
-- the extractors take) is stored as that sentence's `fact_idx` in extracted_facts, `description` NULL; any other
-- description is stored as text, `fact_idx` NULL (lazyhippo.stores.warehouse.described reads them back). Every pair
-- of names in a sentence repeated it: the three staging tables 44.0 -> 30.1 MB at 10,000 documents. Tables written
-- before hold every description as text (rewritten once on open: lazyhippo.stores.warehouse._migrate_descriptions).
-- A name (an entity's, a relation's ends) among the names of the sentence its description refers to is stored as
-- its place in that sentence's `names` (1-based: `name_pos`, `source_pos`, `target_pos`), the name NULL; any other
-- as text (lazyhippo.stores.warehouse.named reads them back). Each pair of a sentence repeated both names, each
-- name its text: the two tables 21.0 -> 9.0 MB at 10,000 documents. Tables written before hold every name as
-- text (rewritten once on open: lazyhippo.stores.warehouse._migrate_places).
CREATE TABLE IF NOT EXISTS extracted_entities (
  namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, name VARCHAR, type VARCHAR,
  description VARCHAR, fact_idx INTEGER, name_pos INTEGER);
CREATE TABLE IF NOT EXISTS extracted_relations (
  namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, source VARCHAR, target VARCHAR, description VARCHAR,
  weight DOUBLE, type VARCHAR, fact_idx INTEGER, source_pos INTEGER, target_pos INTEGER);
-- Which extraction of each document the warehouse holds (lazyhippo/parts.py): the signature of its chunks'
-- cache keys, so a parallel run plans only the documents whose chunks or extractor changed.
CREATE TABLE IF NOT EXISTS extraction_parts (
  namespace VARCHAR NOT NULL, doc_id VARCHAR NOT NULL, signature VARCHAR NOT NULL, PRIMARY KEY (namespace, doc_id));
CREATE TABLE IF NOT EXISTS extraction_failures (
  namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, reason VARCHAR NOT NULL,
  PRIMARY KEY (namespace, chunk_id));
-- The derived tables below (entities to entity_scores, stage_inputs) carry no PRIMARY KEY: their writers replace
-- rows by key (warehouse.replace_rows, run_sql_model), and the keys' ART indexes were a third of the file.
-- Files written before keep theirs.
CREATE TABLE IF NOT EXISTS entities (
  namespace VARCHAR NOT NULL, entity_id VARCHAR NOT NULL, name VARCHAR NOT NULL,
  norm_name VARCHAR NOT NULL, type VARCHAR, description VARCHAR USING COMPRESSION zstd, mention_count BIGINT,
  degree BIGINT);
-- relation_id is derived from the pair (source_id < target_id) when read, not stored: random hex of 13.7 M relations
-- took 139 MB, 5% of the warehouse at 100,000 documents. Tables written before store it (rewritten once on open).
CREATE TABLE IF NOT EXISTS relations (
  namespace VARCHAR NOT NULL,
  relation_id VARCHAR GENERATED ALWAYS AS ('r_' || substr(sha256(source_id || '|' || target_id), 1, 16)) VIRTUAL,
  source_id VARCHAR NOT NULL, target_id VARCHAR NOT NULL, description VARCHAR, weight DOUBLE, n_chunks BIGINT);
-- a relation's type (upper snake case; RELATED_TO when the extraction gave none) and whether it reads from
-- source_id to target_id (the pair is stored in id order, the type in the order the passage states it)
ALTER TABLE relations ADD COLUMN IF NOT EXISTS type VARCHAR DEFAULT 'RELATED_TO';
ALTER TABLE relations ADD COLUMN IF NOT EXISTS forward BOOLEAN DEFAULT true;
CREATE TABLE IF NOT EXISTS mentions (
  namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, entity_id VARCHAR NOT NULL,
  count BIGINT NOT NULL);
-- A fact is a sentence of its chunk: its text is stored as its place in the chunk's text (`span_start`, 0-based,
-- and `span_length`, in characters as DuckDB's substr and Python's str count them), `text` NULL; a text not found
-- there is stored whole, the span NULL (lazyhippo.stores.warehouse.fact_texts reads them back). Each fact's text
-- stored twice beside its chunk's was 4-5% of a home. Tables written before hold every text (rewritten once on
-- open: lazyhippo.stores.warehouse._migrate_spans).
CREATE TABLE IF NOT EXISTS extracted_facts (
  namespace VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL, fact_idx INTEGER NOT NULL,
  span_start INTEGER, span_length INTEGER, text VARCHAR USING COMPRESSION zstd, names VARCHAR[] NOT NULL);
CREATE TABLE IF NOT EXISTS facts (
  namespace VARCHAR NOT NULL, fact_id VARCHAR NOT NULL, chunk_id VARCHAR NOT NULL,
  span_start INTEGER, span_length INTEGER, text VARCHAR USING COMPRESSION zstd, entity_ids VARCHAR[] NOT NULL);
-- Vectors in int8, a scale per vector (value = code i * scale): a quarter of float32, cosines within about 0.003
-- (lazyhippo.stores.warehouse.quantize). A vector's codes are one BLOB of its bytes, zstd-compressed (DuckDB
-- compresses no TINYINT[]: 14% smaller, the same codes); files written before hold TINYINT[] or FLOAT[] (migrated
-- on open).
CREATE TABLE IF NOT EXISTS embeddings (
  namespace VARCHAR NOT NULL, kind VARCHAR NOT NULL, item_id VARCHAR NOT NULL,
  model VARCHAR NOT NULL, vector BLOB USING COMPRESSION zstd NOT NULL, scale FLOAT NOT NULL);
-- the hash of the text a vector was computed from (incremental.fingerprint: 64 bits, where files written before
-- held 32 hex digits, migrated once on open): a changed text is embedded again (older files lack it)
ALTER TABLE embeddings ADD COLUMN IF NOT EXISTS text_hash UBIGINT;
CREATE TABLE IF NOT EXISTS knn_edges (
  namespace VARCHAR NOT NULL, source_id VARCHAR NOT NULL, target_id VARCHAR NOT NULL,
  score DOUBLE NOT NULL, rank INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS entity_scores (
  namespace VARCHAR NOT NULL, entity_id VARCHAR NOT NULL, community_id VARCHAR NOT NULL,
  pagerank DOUBLE NOT NULL);
CREATE TABLE IF NOT EXISTS communities (
  namespace VARCHAR NOT NULL, community_id VARCHAR NOT NULL, level INTEGER NOT NULL,
  size BIGINT NOT NULL, modularity DOUBLE, PRIMARY KEY (namespace, community_id));
-- Community levels: level 0 is the coarsest; each community's parent is the one that holds it a level up.
ALTER TABLE communities ADD COLUMN IF NOT EXISTS parent_id VARCHAR;
CREATE TABLE IF NOT EXISTS community_summaries (
  namespace VARCHAR NOT NULL, community_id VARCHAR NOT NULL, title VARCHAR NOT NULL,
  summary VARCHAR NOT NULL, hub_entities VARCHAR[] NOT NULL, PRIMARY KEY (namespace, community_id));
CREATE TABLE IF NOT EXISTS community_reports (
  namespace VARCHAR NOT NULL, community_id VARCHAR NOT NULL, title VARCHAR NOT NULL,
  summary VARCHAR NOT NULL, rating DOUBLE NOT NULL, rating_reason VARCHAR, findings VARCHAR NOT NULL,
  questions VARCHAR[] NOT NULL, model VARCHAR, PRIMARY KEY (namespace, community_id));
CREATE TABLE IF NOT EXISTS token_usage (
  namespace VARCHAR NOT NULL, run_id VARCHAR, stage VARCHAR NOT NULL, model VARCHAR,
  prompt_tokens BIGINT, completion_tokens BIGINT, recorded_at TIMESTAMP DEFAULT current_timestamp);
-- Entity name normalization is the Python function lazyhippo.names.norm_key, registered on every connection
-- as lh_norm (Unicode-aware, one definition for SQL, Neo4j and queries), with the temporary macro lh_entity_id;
-- drop the ASCII-only macros that older warehouse files persisted.
DROP MACRO IF EXISTS lh_entity_id;
DROP MACRO IF EXISTS lh_norm;
-- Fingerprints of what a stage last computed from (lazyhippo/stages/incremental.py): an update recomputes only
-- what its change touched. 64 bits of each item's input (files written before held text, migrated once on
-- open) and what the stage reads back of an item (the entities stage: the entity ids a chunk named).
CREATE TABLE IF NOT EXISTS stage_inputs (
  namespace VARCHAR NOT NULL, stage VARCHAR NOT NULL, item_id VARCHAR NOT NULL, fingerprint UBIGINT NOT NULL,
  detail VARCHAR USING COMPRESSION zstd);
