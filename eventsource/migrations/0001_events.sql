-- The event store. {{schema}} is replaced by the quoted schema name.

-- One row per stream: its current version (the last event's, 0-based).
-- Appends to a stream serialise on this row, and only on this row.
CREATE TABLE {{schema}}.streams (
    stream_name text PRIMARY KEY,
    version     bigint NOT NULL
);

-- Events. seq is the insertion order (handed out before commit, so it can
-- commit out of order); position is the global order, assigned after commit
-- by the sequencer in commit-safe order, NULL until then.
--
-- Per-stream order rests on seq being handed out in time order: an append
-- takes its seq only after it holds its stream's row lock, so after the
-- stream's previous append committed. Keep the identity's CACHE at 1: with
-- a cache, each session hands out numbers from its own range, and a later
-- append could get a smaller seq than an earlier one.
CREATE TABLE {{schema}}.events (
    seq         bigint GENERATED ALWAYS AS IDENTITY,
    position    bigint,
    event_id    uuid   NOT NULL,
    stream_name text   NOT NULL,
    category    text   NOT NULL,
    cardinal_id text   NOT NULL,
    cg_hash     bigint NOT NULL,
    version     bigint NOT NULL,
    type        text   NOT NULL,
    data        jsonb  NOT NULL,
    metadata    jsonb,
    recorded_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX events_event_id ON {{schema}}.events (event_id);
ALTER TABLE {{schema}}.events ADD CONSTRAINT events_pkey PRIMARY KEY (stream_name, version);
CREATE UNIQUE INDEX events_position ON {{schema}}.events (position) WHERE position IS NOT NULL;
CREATE INDEX events_category_position ON {{schema}}.events (category, position) WHERE position IS NOT NULL;
CREATE INDEX events_unsequenced ON {{schema}}.events (seq) WHERE position IS NULL;

-- The sequencer's single row: the last global position handed out, and
-- low_seq, a watermark below which every event is sequenced or was rolled
-- back, so that the sequencer's search for unsequenced events starts there
-- rather than at the first of the index entries its updates left dead. The
-- sequencer holds the row FOR UPDATE while it assigns positions.
CREATE TABLE {{schema}}.sequencer (
    id            int PRIMARY KEY CHECK (id = 1),
    last_position bigint NOT NULL,
    low_seq       bigint NOT NULL DEFAULT 0
);
INSERT INTO {{schema}}.sequencer (id, last_position) VALUES (1, 0);

-- The consumer-group hash: the first 8 bytes of md5(cardinal id), read as a
-- big-endian signed 64-bit integer. eventsource.Hash computes the same in Go.
CREATE FUNCTION {{schema}}.cg_hash(cardinal_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT ('x' || substr(md5(cardinal_id), 1, 16))::bit(64)::bigint $$;

-- The member (bucket) of a hash for a group of n: the non-negative remainder.
CREATE FUNCTION {{schema}}.cg_member(hash bigint, n int) RETURNS int
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT (((hash % n) + n) % n)::int $$;

-- Checkpoints per (subscription, bucket): the last handled global position.
CREATE TABLE {{schema}}.checkpoints (
    subscription text   NOT NULL,
    bucket       int    NOT NULL,
    position     bigint NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (subscription, bucket)
);

-- Dead letters per (subscription, event).
CREATE TABLE {{schema}}.dead_letters (
    subscription text   NOT NULL,
    bucket       int    NOT NULL,
    event_id     uuid   NOT NULL,
    position     bigint NOT NULL,
    stream_name  text   NOT NULL,
    reason       text   NOT NULL,
    attempts     int    NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    replayed_at  timestamptz,
    PRIMARY KEY (subscription, event_id)
);
CREATE INDEX dead_letters_bucket ON {{schema}}.dead_letters (subscription, bucket, position);
