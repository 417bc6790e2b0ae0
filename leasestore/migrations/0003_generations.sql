-- Generations: a subscription's bucket count can change online (docs/resize.md).
-- lease_buckets.bucket now holds the slot, generation * 65536 + bucket;
-- generation 0's slots are its buckets, so a subscription never resized
-- reads exactly as before.

-- One row per subscription: the serving generation and a resize in
-- progress, if any. Every resize transition locks this row FOR UPDATE
-- first (the lock order: this row, then lease rows in slot order); a pass
-- never waits for it.
CREATE TABLE {{schema}}.subscriptions (
    subscription      text        PRIMARY KEY,
    generation        integer     NOT NULL DEFAULT 0,   -- the serving generation g
    bucket_count      integer     NOT NULL,             -- its N
    state             text        NOT NULL DEFAULT 'steady',
    next_bucket_count integer,                          -- M, while a resize is on
    cut               bigint,                           -- C, once decided
    requested_at      timestamptz,
    requested_by      text,
    switched_at       timestamptz,
    updated_at        timestamptz NOT NULL DEFAULT now(),
    CHECK (state IN ('steady', 'sealing', 'cut', 'switched')),
    CHECK (generation BETWEEN 0 AND 32767),
    CHECK (bucket_count BETWEEN 1 AND 65536),
    CHECK ((state = 'steady') = (next_bucket_count IS NULL)),
    CHECK (next_bucket_count IS NULL OR next_bucket_count BETWEEN 1 AND 65536),
    CHECK ((state IN ('cut', 'switched')) = (cut IS NOT NULL)),
    CHECK (state = 'steady' OR generation < 32767)
);

-- One row per generation, kept after it retires: its N and the positions
-- it covered, for status, dead letters and audits.
CREATE TABLE {{schema}}.generations (
    subscription text        NOT NULL,
    generation   integer     NOT NULL,
    bucket_count integer     NOT NULL,
    start_after  bigint,              -- its first position is above this; 0 for generation 0; NULL until the cut
    end_at       bigint,              -- its last position; NULL while it serves
    created_at   timestamptz NOT NULL DEFAULT now(),
    switched_at  timestamptz,         -- its first bucket started (generation 0: created_at)
    retired_at   timestamptz,         -- its last bucket drained
    PRIMARY KEY (subscription, generation),
    CHECK (bucket_count BETWEEN 1 AND 65536),
    CHECK (end_at IS NULL OR start_after IS NULL OR end_at >= start_after)
);

-- Per lease row: its generation (the slot's high part), its holder's cut
-- proposal, the cut it drained to, and when it drained.
ALTER TABLE {{schema}}.lease_buckets
    ADD COLUMN generation   integer NOT NULL DEFAULT 0,
    ADD COLUMN cut_proposal bigint,
    ADD COLUMN cut          bigint,
    ADD COLUMN drained_at   timestamptz;
-- 0001's first CHECK, (bucket_count > 0 AND bucket >= 0 AND bucket <
-- bucket_count) (0001 named the column shard_count; 0002 renamed it), is
-- named lease_buckets_check by PostgreSQL: the first multi-column CHECK of
-- the table. TestMigrationGenerations asserts its definition.
ALTER TABLE {{schema}}.lease_buckets DROP CONSTRAINT lease_buckets_check;
ALTER TABLE {{schema}}.lease_buckets ADD CONSTRAINT lease_buckets_slot CHECK (
    bucket_count BETWEEN 1 AND 65536 AND bucket >= 0
    AND bucket / 65536 = generation AND bucket % 65536 < bucket_count);
ALTER TABLE {{schema}}.lease_buckets ADD CONSTRAINT lease_buckets_drained CHECK (
    drained_at IS NULL OR (owner IS NULL AND cut IS NOT NULL));

-- The kumi protocol each worker speaks: 1 for versions before generations
-- (their statements do not name the column), 2 from this one.
ALTER TABLE {{schema}}.lease_workers ADD COLUMN protocol integer NOT NULL DEFAULT 1;

-- Existing subscriptions are generation 0 with the N of their rows.
INSERT INTO {{schema}}.subscriptions (subscription, bucket_count)
SELECT subscription, max(bucket_count) FROM {{schema}}.lease_buckets GROUP BY subscription
ON CONFLICT DO NOTHING;
INSERT INTO {{schema}}.generations (subscription, generation, bucket_count, start_after, switched_at)
SELECT subscription, 0, bucket_count, 0, now() FROM {{schema}}.subscriptions
ON CONFLICT DO NOTHING;

-- The fence against workers that predate generations: their heartbeat —
-- the first statement of every pass — fails for a subscription that has
-- been resized or is being resized, so their passes fail, their leases
-- lapse and EnsureHeld stops their deliveries. Protocol-2 transactions set
-- kumi.protocol and pass through. The schema is taken from
-- TG_TABLE_SCHEMA, never written into the body: a schema name may contain
-- anything, dollar quotes included.
CREATE FUNCTION {{schema}}.lease_workers_protocol() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    gen int;
    st  text;
BEGIN
    IF coalesce(current_setting('kumi.protocol', true), '') <> '' THEN
        RETURN NEW;
    END IF;
    -- FOR SHARE whatever the state: a request holding the row FOR UPDATE
    -- makes this wait, and the row is then read as committed.
    EXECUTE format('SELECT generation, state FROM %I.subscriptions WHERE subscription = $1 FOR SHARE',
                   TG_TABLE_SCHEMA)
        INTO gen, st USING NEW.subscription;
    IF gen > 0 OR st <> 'steady' THEN
        RAISE EXCEPTION 'kumi: subscription % has changed or is changing its bucket count; '
            'this worker runs a kumi version that predates resizes and may not take part: '
            'upgrade it (docs/operations.md#upgrading)', NEW.subscription
            USING ERRCODE = 'KU001';
    END IF;
    RETURN NEW;
END $fn$;
CREATE TRIGGER lease_workers_protocol BEFORE INSERT OR UPDATE ON {{schema}}.lease_workers
    FOR EACH ROW EXECUTE FUNCTION {{schema}}.lease_workers_protocol();
