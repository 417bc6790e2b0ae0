-- Positions per append, not per event (docs/eventsource.md, "Sequencing
-- appends"). {{schema}} is replaced by the quoted schema name.
--
-- Appends wait on this lock. A process of the previous version still
-- running afterwards fails loudly, writing nothing: its sequencer and its
-- reads name events.position, which is gone, and its appends give no seq,
-- which is NOT NULL without a default now.
LOCK TABLE {{schema}}.events IN ACCESS EXCLUSIVE MODE;
-- For the unqualified names below (pg_get_serial_sequence reads its
-- argument as SQL text, which a schema name must not be spliced into).
SET LOCAL search_path = {{schema}}, pg_temp;

-- One row per append: a run of consecutive versions of one stream, written
-- by the append statement in the append's transaction. seq is its
-- insertion number, drawn after the stream's row lock (so a stream's
-- ranges have increasing seqs in version order); keep the identity's CACHE
-- at 1 (see 0001). last_position is the position of its last event, NULL
-- until the sequencer numbers it; an event's position is last_position -
-- last_version + version.
CREATE TABLE {{schema}}.appends (
    seq           bigint GENERATED ALWAYS AS IDENTITY,
    stream_name   text   NOT NULL,
    first_version bigint NOT NULL,
    last_version  bigint NOT NULL,
    category      text   NOT NULL,
    cg_hash       bigint NOT NULL,
    last_position bigint,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, first_version)
);

-- Every existing event becomes a range of its own, with its seq and its
-- position; new ranges draw seqs above them.
INSERT INTO {{schema}}.appends (seq, stream_name, first_version, last_version, category, cg_hash, last_position, recorded_at)
OVERRIDING SYSTEM VALUE
SELECT seq, stream_name, version, version, category, cg_hash, position, recorded_at FROM {{schema}}.events;
SELECT setval(pg_get_serial_sequence('appends', 'seq'), max(seq)) FROM {{schema}}.events HAVING max(seq) IS NOT NULL;

CREATE UNIQUE INDEX appends_position ON {{schema}}.appends (last_position) WHERE last_position IS NOT NULL;
CREATE INDEX appends_category_position ON {{schema}}.appends (category, last_position) WHERE last_position IS NOT NULL;
CREATE INDEX appends_unsequenced ON {{schema}}.appends (seq) WHERE last_position IS NULL;

-- Drops events_position, events_category_position, events_unsequenced and
-- every consumer-group index events_cg_<n>: those are rebuilt on appends.
ALTER TABLE {{schema}}.events DROP COLUMN position;
-- An event's seq is now its range's, given by the append statement: one
-- number per append, not per event. An insert that gives none is refused
-- (NOT NULL): an event without a range would never get a position.
ALTER TABLE {{schema}}.events ALTER COLUMN seq DROP IDENTITY;
