-- Positions per append, not per event (docs/eventsource.md, "Sequencing
-- appends"). {{schema}} is replaced by the quoted schema name.
--
-- Appends wait on this lock, and a process of the previous version fails
-- loudly once it is done (events.position is gone).
LOCK TABLE {{schema}}.events IN ACCESS EXCLUSIVE MODE;

-- One row per append: a run of consecutive versions of one stream, written
-- by the trigger below in the inserting statement's transaction. seq is
-- the largest seq of its events (drawn after the stream's row lock, so a
-- stream's ranges have increasing seqs in version order). last_position is
-- the position of its last event, NULL until the sequencer numbers it; an
-- event's position is last_position - last_version + version.
CREATE TABLE {{schema}}.appends (
    seq           bigint NOT NULL,
    stream_name   text   NOT NULL,
    first_version bigint NOT NULL,
    last_version  bigint NOT NULL,
    category      text   NOT NULL,
    cg_hash       bigint NOT NULL,
    last_position bigint,
    recorded_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (stream_name, first_version)
);

-- Every existing event becomes a range of its own, with its position.
INSERT INTO {{schema}}.appends (seq, stream_name, first_version, last_version, category, cg_hash, last_position, recorded_at)
SELECT seq, stream_name, version, version, category, cg_hash, position, recorded_at FROM {{schema}}.events;

CREATE UNIQUE INDEX appends_position ON {{schema}}.appends (last_position) WHERE last_position IS NOT NULL;
CREATE INDEX appends_category_position ON {{schema}}.appends (category, last_position) WHERE last_position IS NOT NULL;
CREATE INDEX appends_unsequenced ON {{schema}}.appends (seq) WHERE last_position IS NULL;

-- Drops events_position, events_category_position, events_unsequenced and
-- every consumer-group index events_cg_<n>: those are rebuilt on appends.
ALTER TABLE {{schema}}.events DROP COLUMN position;

-- One range per stream and run of consecutive versions of the statement's
-- inserted rows. The function's search_path is the store's schema (then
-- pg_temp, so that no temporary table can stand in for appends), so no
-- schema name is written into its body.
CREATE FUNCTION {{schema}}.events_appended() RETURNS trigger
    LANGUAGE plpgsql SET search_path = {{schema}}, pg_temp
    AS $$
BEGIN
    INSERT INTO appends (seq, stream_name, first_version, last_version, category, cg_hash, recorded_at)
    SELECT max(seq), stream_name, min(version), max(version), min(category), min(cg_hash), min(recorded_at)
    FROM (SELECT seq, stream_name, version, category, cg_hash, recorded_at,
                 version - row_number() OVER (PARTITION BY stream_name ORDER BY version) AS run
          FROM appended) r
    GROUP BY stream_name, run;
    RETURN NULL;
END
$$;
CREATE TRIGGER events_appended AFTER INSERT ON {{schema}}.events
    REFERENCING NEW TABLE AS appended FOR EACH STATEMENT EXECUTE FUNCTION {{schema}}.events_appended();
