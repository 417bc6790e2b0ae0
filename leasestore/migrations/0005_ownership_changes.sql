-- The ownership record (docs/operations.md, "Who owned a bucket, and why"):
-- every change of a bucket's owner, epoch or pending claim, every worker
-- joining or leaving and every step of a resize, with the database's time
-- of the change, its kind, the evidence the database had for it and who
-- made it (the login role and its application_name: a worker's pool names
-- the worker, `kumi <command>` and the console name themselves). Triggers
-- write it, so no path of the lease store, the CLI, the console or a
-- user's own SQL can change ownership without a row here. A renewal
-- (expires_at, heartbeat_at only) writes nothing.
--
-- Rows older than ownership_retention.keep are pruned as new ones are
-- written (a bounded batch, SKIP LOCKED: a writer never waits for another's
-- prune). The trigger functions run as the schema's owner (SECURITY
-- DEFINER), so workers need no grant on the record; operators read it
-- with their SELECT on every table.
CREATE TABLE {{schema}}.ownership_changes (
    id           bigserial   PRIMARY KEY,
    at           timestamptz NOT NULL DEFAULT clock_timestamp(),
    subscription text        NOT NULL,
    kind         text        NOT NULL,
    generation   integer,             -- NULL for a worker or the subscription
    bucket       integer,             -- within its generation; NULL as generation
    from_owner   text,
    to_owner     text,
    epoch        bigint,              -- the lease's epoch after the change
    evidence     text        NOT NULL DEFAULT '',
    by_role      text        NOT NULL DEFAULT session_user,
    by_app       text        NOT NULL DEFAULT '',
    CHECK (kind IN ('claim', 'handoff', 'steal', 'reclaim', 'release', 'drain', 'request', 'withdraw',
                    'fence', 'remove', 'join', 'leave', 'resize'))
);
CREATE INDEX ownership_changes_slot ON {{schema}}.ownership_changes (subscription, generation, bucket, id);
CREATE INDEX ownership_changes_at ON {{schema}}.ownership_changes (at);

-- How long the record keeps a change. One row.
CREATE TABLE {{schema}}.ownership_retention (
    one  boolean  PRIMARY KEY DEFAULT true CHECK (one),
    keep interval NOT NULL DEFAULT '7 days' CHECK (keep >= interval '0')
);
INSERT INTO {{schema}}.ownership_retention DEFAULT VALUES;

-- ownership_note writes one change and prunes what retention no longer
-- keeps. The schema is taken from the trigger's table and passed on, never
-- written into a body: a schema name may contain anything, dollar quotes
-- included. Times in the evidence are UTC.
CREATE FUNCTION {{schema}}.ownership_note(sch text, sub text, kind text, gen int, bucket int,
                                          from_owner text, to_owner text, epoch bigint, evidence text)
    RETURNS void LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    EXECUTE format('INSERT INTO %I.ownership_changes (subscription, kind, generation, bucket, from_owner, to_owner,'
                   ' epoch, evidence, by_role, by_app) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)', sch)
        USING sub, kind, gen, bucket, from_owner, to_owner, epoch, coalesce(evidence, ''), session_user::text,
              coalesce(current_setting('application_name', true), '');
    EXECUTE format('DELETE FROM %1$I.ownership_changes WHERE id IN ('
                   ' SELECT c.id FROM %1$I.ownership_changes c, %1$I.ownership_retention r'
                   ' WHERE c.at < now() - r.keep ORDER BY c.at LIMIT 100 FOR UPDATE OF c SKIP LOCKED)', sch);
END $fn$;

-- A lease row's change: its kind, and the evidence the row and the
-- worker table give for it.
CREATE FUNCTION {{schema}}.ownership_lease_change() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    sch   text := TG_TABLE_SCHEMA;
    r     record;
    k     text;
    ev    text := '';
    from_ text;
    to_   text;
    wexp  timestamptz;
BEGIN
    IF TG_OP = 'DELETE' THEN
        r := OLD;
        IF OLD.owner IS NULL AND OLD.claim_worker IS NULL THEN
            RETURN NULL; -- a drained or free row retired
        END IF;
        k := 'remove';
        from_ := OLD.owner;
        ev := 'its lease row was removed (a cancelled resize)';
    ELSIF TG_OP = 'INSERT' THEN
        r := NEW;
        IF NEW.owner IS NULL THEN
            RETURN NULL; -- rows are made free
        END IF;
        k := 'claim';
        to_ := NEW.owner;
        ev := 'a new lease row';
    ELSIF OLD.owner IS NOT DISTINCT FROM NEW.owner THEN
        r := NEW;
        from_ := OLD.owner;
        to_ := NEW.owner;
        IF OLD.epoch <> NEW.epoch THEN
            k := CASE WHEN NEW.owner IS NULL THEN 'fence' ELSE 'reclaim' END;
            ev := format('epoch %s -> %s', OLD.epoch, NEW.epoch);
        ELSIF NEW.claim_worker IS NOT NULL THEN
            k := 'request';
            to_ := NEW.claim_worker;
            ev := format('%s asks %s to hand the bucket over', NEW.claim_worker, coalesce(NEW.owner, 'nobody'));
        ELSE
            k := 'withdraw';
            to_ := OLD.claim_worker;
            ev := format('the claim %s placed at %s is withdrawn', OLD.claim_worker,
                         to_char(OLD.claimed_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS'));
        END IF;
    ELSIF NEW.owner IS NULL THEN
        r := NEW;
        from_ := OLD.owner;
        IF NEW.drained_at IS NOT NULL THEN
            k := 'drain';
            ev := format('drained to the cut %s', NEW.cut);
        ELSE
            k := 'release';
            IF NEW.claim_worker IS NOT NULL THEN
                ev := 'handing over to ' || NEW.claim_worker;
            END IF;
        END IF;
    ELSIF OLD.owner IS NULL THEN
        r := NEW;
        to_ := NEW.owner;
        IF OLD.claim_worker IS NOT DISTINCT FROM NEW.owner THEN
            -- The second phase of a handoff: its first owner is the one
            -- whose release handed it over.
            k := 'handoff';
            EXECUTE format('SELECT from_owner FROM %I.ownership_changes WHERE subscription = $1 AND generation = $2'
                           ' AND bucket = $3 AND kind = ''release'' ORDER BY id DESC LIMIT 1', sch)
                INTO from_ USING NEW.subscription, NEW.bucket / 65536, NEW.bucket % 65536;
            ev := format('%s had claimed it at %s', NEW.owner,
                         to_char(OLD.claimed_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS'));
        ELSE
            k := 'claim';
            IF OLD.heartbeat_at IS NOT NULL THEN
                ev := 'free since ' || to_char(OLD.heartbeat_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS');
            END IF;
        END IF;
    ELSE
        -- Another owner took a held bucket without a handoff: say why it could.
        r := NEW;
        k := 'steal';
        from_ := OLD.owner;
        to_ := NEW.owner;
        EXECUTE format('SELECT expires_at FROM %I.lease_workers WHERE subscription = $1 AND worker = $2', sch)
            INTO wexp USING NEW.subscription, OLD.owner;
        ev := format('%s''s lease %s %s, last renewed at %s', OLD.owner,
                     CASE WHEN OLD.expires_at < now() THEN 'had expired at' ELSE 'ran until' END,
                     to_char(OLD.expires_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS'),
                     to_char(OLD.heartbeat_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS'));
        ev := ev || CASE
            WHEN wexp IS NULL THEN format('; %s has left the pool', OLD.owner)
            WHEN wexp <= now() THEN format('; %s''s worker row had expired at %s, or its session ended', OLD.owner,
                                           to_char(wexp AT TIME ZONE 'UTC', 'HH24:MI:SS.MS'))
            ELSE format('; %s is still a live worker', OLD.owner) END;
    END IF;
    EXECUTE format('SELECT %I.ownership_note($1, $2, $3, $4, $5, $6, $7, $8, $9)', sch)
        USING sch, r.subscription, k, r.bucket / 65536, r.bucket % 65536, from_, to_, r.epoch, ev;
    RETURN NULL;
END $fn$;
CREATE TRIGGER ownership_lease_change AFTER UPDATE ON {{schema}}.lease_buckets FOR EACH ROW
    WHEN (OLD.owner IS DISTINCT FROM NEW.owner OR OLD.epoch <> NEW.epoch
          OR OLD.claim_worker IS DISTINCT FROM NEW.claim_worker)
    EXECUTE FUNCTION {{schema}}.ownership_lease_change();
CREATE TRIGGER ownership_lease_row AFTER INSERT OR DELETE ON {{schema}}.lease_buckets FOR EACH ROW
    EXECUTE FUNCTION {{schema}}.ownership_lease_change();

-- A worker joining or leaving a subscription's pool.
CREATE FUNCTION {{schema}}.ownership_worker_change() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        EXECUTE format('SELECT %I.ownership_note($1, $2, $3, NULL, NULL, NULL, $4, NULL, $5)', TG_TABLE_SCHEMA)
            USING TG_TABLE_SCHEMA, NEW.subscription, 'join', NEW.worker, format('a %s-kind worker', NEW.kind);
    ELSE
        EXECUTE format('SELECT %I.ownership_note($1, $2, $3, NULL, NULL, $4, NULL, NULL, $5)', TG_TABLE_SCHEMA)
            USING TG_TABLE_SCHEMA, OLD.subscription, 'leave', OLD.worker,
                  CASE WHEN OLD.expires_at < now()
                       THEN 'its row had expired at ' || to_char(OLD.expires_at AT TIME ZONE 'UTC', 'HH24:MI:SS.MS')
                       ELSE 'it left the pool' END;
    END IF;
    RETURN NULL;
END $fn$;
CREATE TRIGGER ownership_worker_change AFTER INSERT OR DELETE ON {{schema}}.lease_workers FOR EACH ROW
    EXECUTE FUNCTION {{schema}}.ownership_worker_change();

-- A step of a resize: requested, cut decided, switched, completed or
-- cancelled.
CREATE FUNCTION {{schema}}.ownership_resize_change() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    was text;
    now_ text;
    ev text := '';
BEGIN
    was := CASE WHEN OLD.state = 'steady' THEN format('generation %s, %s buckets', OLD.generation, OLD.bucket_count)
                ELSE format('resize %s: %s -> %s buckets, %s', OLD.resize_id, OLD.bucket_count, OLD.next_bucket_count,
                            OLD.state) END;
    now_ := CASE WHEN NEW.state = 'steady' THEN format('generation %s, %s buckets', NEW.generation, NEW.bucket_count)
                 ELSE format('resize %s: %s -> %s buckets, %s', NEW.resize_id, NEW.bucket_count, NEW.next_bucket_count,
                             NEW.state) END
            || CASE WHEN NEW.cut IS NULL THEN '' ELSE format(', cut %s', NEW.cut) END;
    IF OLD.state = 'steady' AND NEW.state <> 'steady' THEN
        ev := 'requested by ' || coalesce(NEW.requested_by, 'unknown');
    ELSIF OLD.state <> 'steady' AND NEW.state = 'steady' THEN
        ev := CASE WHEN NEW.generation = OLD.generation THEN 'cancelled' ELSE 'completed' END;
    END IF;
    EXECUTE format('SELECT %I.ownership_note($1, $2, $3, NULL, NULL, $4, $5, NULL, $6)', TG_TABLE_SCHEMA)
        USING TG_TABLE_SCHEMA, NEW.subscription, 'resize', was, now_, ev;
    RETURN NULL;
END $fn$;
CREATE TRIGGER ownership_resize_change AFTER UPDATE ON {{schema}}.subscriptions FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.generation <> NEW.generation
          OR OLD.cut IS DISTINCT FROM NEW.cut OR OLD.resize_id <> NEW.resize_id)
    EXECUTE FUNCTION {{schema}}.ownership_resize_change();
