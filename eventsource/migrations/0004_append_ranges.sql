-- Positions per append, not per event (docs/eventsource.md, "Sequencing
-- appends"). {{schema}} is replaced by the quoted schema name.
--
-- Appends wait on this lock. A process of the previous version still
-- running afterwards fails loudly in its sequencer and its reads
-- (events.position is gone); its appends go on, through the trigger below.
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
-- number per append, not per event.
ALTER TABLE {{schema}}.events ALTER COLUMN seq DROP IDENTITY;

-- An insert that gives no seq (SQL written by hand or by a tool, or the
-- append statement of a process of the previous version) gets a range per
-- event here. It takes its transaction's xid before it draws the seq, as
-- the append statement does (see the sequencer's watermark). The append
-- statement gives the seq, and the WHEN clause skips the function. The
-- function's search_path is the store's schema (then pg_temp, so that no
-- temporary table stands in for appends): no schema name in its body.
CREATE FUNCTION {{schema}}.events_range() RETURNS trigger
    LANGUAGE plpgsql SET search_path = {{schema}}, pg_temp
    AS $$
BEGIN
    PERFORM pg_current_xact_id();
    INSERT INTO appends (stream_name, first_version, last_version, category, cg_hash, recorded_at)
    VALUES (NEW.stream_name, NEW.version, NEW.version, NEW.category, NEW.cg_hash, NEW.recorded_at)
    RETURNING seq INTO NEW.seq;
    RETURN NEW;
END
$$;
CREATE TRIGGER events_range BEFORE INSERT ON {{schema}}.events
    FOR EACH ROW WHEN (NEW.seq IS NULL) EXECUTE FUNCTION {{schema}}.events_range();
