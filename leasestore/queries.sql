-- Every statement of the lease store, one place to read and review them.
-- A "-- name: x" line starts statement x. {{schema}} is the quoted schema.
-- Every time is the database's now(): the transaction's start, the same for
-- every statement of a pass, and never later than the moment a row is
-- judged, so it errs towards "not yet expired".
-- $1 is always the subscription, $2 (where present) this worker.

-- name: ensure_lock
-- Serialises EnsureBuckets of one subscription across processes.
SELECT pg_advisory_xact_lock($1);

-- name: pass_begin
-- A pass's first statement after BEGIN, in the same round trip: bound this
-- transaction's row locks (idle_in_transaction_session_timeout = the TTL,
-- $1; see boundLocks in fence.go) and speak protocol 2 (the lease_workers
-- trigger lets protocol-2 writes through and fences out protocol-1
-- workers of a subscription that is resizing or has been resized, KU001).
SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('kumi.protocol', '2', true);

-- name: worker_heartbeat
-- Join or heartbeat; monotonic, so a delayed heartbeat never moves expiry
-- back. $3 kind, $4 ttl, $5 session backend pid, $6 session lock key. Run
-- after pass_begin (the lease_workers trigger).
-- joined reports a worker that was absent or expired before this statement.
-- Then, in the same statement, the pass's view of the subscription, no
-- lock (found is false when it has no subscriptions row): its serving
-- generation and resize, the serving generation's active (undrained)
-- bucket count, the feeder classes (bucket % gcd(N, M)) that still have an
-- undrained bucket once the cut is decided, and whether rows of retired
-- generations are left to prune. Every pass reads it, so a worker learns of
-- a resize by its pass alone; a notification only wakes it sooner. In a
-- steady subscription the lateral part reads nothing (its filter on the
-- state is decided once) and the retired-rows probe is one index lookup.
WITH prev AS (
    SELECT expires_at > now() AS live
    FROM {{schema}}.lease_workers WHERE subscription = $1 AND worker = $2
), up AS (
    INSERT INTO {{schema}}.lease_workers AS m
        (subscription, worker, kind, heartbeat_at, expires_at, backend_pid, lock_key, protocol)
    VALUES ($1, $2, $3, now(), now() + $4::interval, $5, $6, 2)
    ON CONFLICT (subscription, worker) DO UPDATE SET
        kind = EXCLUDED.kind,
        protocol = EXCLUDED.protocol,
        heartbeat_at = GREATEST(m.heartbeat_at, EXCLUDED.heartbeat_at),
        expires_at = GREATEST(m.expires_at, EXCLUDED.expires_at),
        backend_pid = EXCLUDED.backend_pid,
        lock_key = EXCLUDED.lock_key
    RETURNING 1
), sub AS (
    SELECT s.generation, s.bucket_count, s.state, coalesce(s.next_bucket_count, 0) AS next, coalesce(s.cut, -1) AS cut,
        s.resize_id,
        CASE WHEN s.state = 'steady' THEN s.bucket_count ELSE o.active END AS active,
        coalesce(o.classes, '{}') AS classes,
        EXISTS (SELECT 1 FROM {{schema}}.lease_buckets r
                WHERE r.subscription = s.subscription AND r.bucket < s.generation * 65536) AS retired_left
    FROM {{schema}}.subscriptions s
    LEFT JOIN LATERAL (
        SELECT count(*) FILTER (WHERE l.drained_at IS NULL)::int AS active,
            array_agg(DISTINCT (l.bucket % 65536) % gcd(s.bucket_count, s.next_bucket_count))
                FILTER (WHERE l.drained_at IS NULL) AS classes
        FROM {{schema}}.lease_buckets l
        WHERE s.state <> 'steady' AND l.subscription = s.subscription AND l.generation = s.generation
    ) o ON true
    WHERE s.subscription = $1
)
SELECT coalesce((SELECT NOT live FROM prev), true) AS joined, sub.generation IS NOT NULL AS found,
    coalesce(sub.generation, 0), coalesce(sub.bucket_count, 0), coalesce(sub.state, ''), coalesce(sub.next, 0),
    coalesce(sub.cut, -1), coalesce(sub.active, 0), coalesce(sub.classes, '{}'), coalesce(sub.retired_left, false),
    coalesce(sub.resize_id, 0)
FROM up LEFT JOIN sub ON true;

-- name: workers_view
-- The other workers, whether each is live, and whether a session worker's
-- advisory lock is free (its session is gone: evidence of death).
WITH held AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT m.worker, m.kind, coalesce(m.lock_key, 0), m.expires_at > now() AS live,
    (m.kind = 'session' AND NOT EXISTS (
        SELECT 1 FROM held h
        WHERE h.classid = ((m.lock_key >> 32) & 4294967295)::oid
          AND h.objid = (m.lock_key & 4294967295)::oid)) AS session_gone,
    m.expires_at < now() - $3::interval AS long_gone
FROM {{schema}}.lease_workers m
WHERE m.subscription = $1 AND m.worker <> $2;

-- name: renew
-- Renew (heartbeat) every bucket this worker owns, and reconfirm it: while a
-- live claimant's claim is pending the expiry is NOT extended (the owner
-- must drain and hand over); a stale claim (claimant not a live worker, or
-- older than $4) is recovered here. Locks in bucket order (mine, whole,
-- before the update writes a row). $3 ttl. The update finds its rows by
-- the owned buckets' array, not by a join with mine: on a table never
-- analyzed (a new subscription) the planner took mine for one row and
-- rescanned every row of the subscription for each bucket owned, a pass
-- quadratic in the buckets held (TestRenewIsLinearInTheBucketsHeld).
WITH mine AS MATERIALIZED (
    SELECT l.bucket, l.claim_worker AS prev_claim,
        (l.claim_worker IS NOT NULL
         AND l.claimed_at >= now() - $4::interval
         AND EXISTS (SELECT 1 FROM {{schema}}.lease_workers m
                     WHERE m.subscription = l.subscription AND m.worker = l.claim_worker
                       AND m.expires_at > now())) AS pending
    FROM {{schema}}.lease_buckets l
    WHERE l.subscription = $1 AND l.owner = $2
    ORDER BY l.bucket
    FOR UPDATE
), sets AS MATERIALIZED (
    SELECT array_agg(bucket) AS owned,
        coalesce(array_agg(bucket) FILTER (WHERE pending), '{}') AS pending,
        coalesce(array_agg(bucket) FILTER (WHERE prev_claim IS NOT NULL AND NOT pending), '{}') AS recovered
    FROM mine
)
UPDATE {{schema}}.lease_buckets l SET
    heartbeat_at = GREATEST(l.heartbeat_at, now()),
    expires_at = CASE WHEN l.bucket = ANY(sets.pending) THEN l.expires_at
                      ELSE GREATEST(l.expires_at, now() + $3::interval) END,
    claim_worker = CASE WHEN l.bucket = ANY(sets.pending) THEN l.claim_worker END,
    claimed_at = CASE WHEN l.bucket = ANY(sets.pending) THEN l.claimed_at END
FROM sets
WHERE l.subscription = $1 AND l.bucket = ANY(sets.owned)
RETURNING l.bucket, l.epoch, l.expires_at, l.bucket = ANY(sets.pending) AS pending,
    l.bucket = ANY(sets.recovered) AS recovered,
    now() AS db_now, l.bucket_count, l.cut_proposal;

-- name: my_claims
-- By generation: this worker's claims ($2), and what its claim and its
-- placement could find there, read without a lock so that a pass skips
-- them when they would find nothing (see passRest): claimable, at least
-- the rows the claim statement may take (not drained, not this worker's,
-- free or expired: a bucket another claimant's claim keeps is counted as
-- well), and top, the highest load among the other workers that own a
-- bucket a claim may be placed on, as loads counts them (0: none).
WITH rows AS MATERIALIZED (
    SELECT bucket, generation, owner, claim_worker, expires_at, drained_at
    FROM {{schema}}.lease_buckets WHERE subscription = $1
), per AS (
    SELECT generation, w, sum(free)::int AS free, sum(n)::int AS n FROM (
        SELECT generation, owner AS w, 1 AS free, 1 AS n FROM rows
        WHERE owner IS NOT NULL AND expires_at > now() AND claim_worker IS NULL
        UNION ALL
        SELECT generation, claim_worker, 0, 1 FROM rows WHERE claim_worker IS NOT NULL
    ) x
    WHERE w <> $2
    GROUP BY generation, w
), top AS (
    SELECT generation, max(n) FILTER (WHERE free > 0) AS top FROM per GROUP BY generation
)
SELECT r.generation, coalesce(array_agg(r.bucket ORDER BY r.bucket) FILTER (WHERE r.claim_worker = $2), '{}'),
    (count(*) FILTER (WHERE r.drained_at IS NULL AND r.owner IS DISTINCT FROM $2
                        AND (r.owner IS NULL OR r.expires_at < now())))::int,
    coalesce((SELECT t.top FROM top t WHERE t.generation = r.generation), 0)
FROM rows r
GROUP BY r.generation;

-- name: confirm_dead
-- Liveness evidence, made atomic: a session worker whose advisory lock this
-- transaction can take has no session. The lock is held until commit, so the
-- worker cannot come back under the same key while its buckets move.
-- $2 workers, $3 their lock keys. SKIP LOCKED: a worker whose row is locked
-- is mid-pass (its heartbeat holds the row to its commit) and is not
-- confirmed dead this time; waiting for the row would be a cycle, since
-- this pass holds its own row and the other pass may confirm this worker,
-- or wait for a lease row this pass holds (TestConfirmDeadNeverWaitsForARow).
WITH dead AS (
    SELECT d.w FROM unnest($2::text[], $3::bigint[]) AS d(w, k)
    WHERE pg_try_advisory_xact_lock(d.k)
), free AS (
    SELECT m.worker FROM {{schema}}.lease_workers m
    WHERE m.subscription = $1 AND m.worker IN (SELECT w FROM dead)
    FOR UPDATE SKIP LOCKED
), marked AS (
    UPDATE {{schema}}.lease_workers m SET expires_at = LEAST(m.expires_at, now())
    FROM free WHERE m.subscription = $1 AND m.worker = free.worker
    RETURNING m.worker
)
SELECT coalesce(array_agg(worker), '{}') FROM marked;

-- name: claim
-- Take up to $3 buckets: this worker's own claims whose owner handed over
-- (or lapsed) first, then free buckets, then expired ones or those of owners
-- proven dead ($4). A bucket under another live claimant's fresh claim is
-- left to that claimant. SKIP LOCKED: never wait behind a rival's claim or
-- an in-flight fenced write. $5 start offset, $6 claim stale-after, $7
-- the generation's bucket count, $8 ttl, $9 the generation. A drained row
-- (an old bucket of a resize) is never claimed.
WITH c AS (
    SELECT l.bucket, l.owner AS prev_owner, (l.claim_worker IS NOT DISTINCT FROM $2) AS was_mine,
        (l.expires_at < now()) AS prev_expired
    FROM {{schema}}.lease_buckets l
    WHERE l.subscription = $1 AND l.generation = $9 AND l.drained_at IS NULL
      AND l.owner IS DISTINCT FROM $2
      AND (l.owner IS NULL OR l.expires_at < now() OR l.owner = ANY($4::text[]))
      AND (l.claim_worker IS NULL OR l.claim_worker = $2 OR l.claim_worker = ANY($4::text[])
           OR l.claimed_at < now() - $6::interval
           OR NOT EXISTS (SELECT 1 FROM {{schema}}.lease_workers m
                          WHERE m.subscription = l.subscription AND m.worker = l.claim_worker
                            AND m.expires_at > now()))
    ORDER BY (l.claim_worker IS NOT DISTINCT FROM $2) DESC, (l.owner IS NULL) DESC,
        (l.bucket % 65536 + $5::int) % $7::int
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {{schema}}.lease_buckets l SET
    owner = $2, epoch = l.epoch + 1, granted_at = now(), heartbeat_at = now(),
    expires_at = now() + $8::interval, claim_worker = NULL, claimed_at = NULL
FROM c
WHERE l.subscription = $1 AND l.bucket = c.bucket
RETURNING l.bucket, l.epoch, l.expires_at, coalesce(c.prev_owner, ''), c.was_mine,
    coalesce(c.prev_expired, false), now() AS db_now, l.bucket_count, l.cut_proposal;

-- name: withdraw_claims
-- Withdraw $3 of this worker's pending claims in generation $4, those not
-- yet handed over first.
UPDATE {{schema}}.lease_buckets l SET claim_worker = NULL, claimed_at = NULL
FROM (SELECT bucket FROM {{schema}}.lease_buckets
      WHERE subscription = $1 AND claim_worker = $2 AND generation = $4
      ORDER BY (owner IS NULL), bucket DESC
      LIMIT $3 FOR UPDATE SKIP LOCKED) w
WHERE l.subscription = $1 AND l.bucket = w.bucket
RETURNING l.bucket;

-- name: placement_lock
-- Serialises two-phase claim placement of one subscription, so that two
-- claimants never both count the same surplus: the next placer's loads
-- read what the previous one committed. Held to the pass's commit; taken
-- (as the owners' rows after it) under a short lock_timeout in a savepoint,
-- so a placer that waits for rows this pass holds makes this pass place
-- nothing rather than deadlock.
SELECT pg_advisory_xact_lock($1);

-- name: loads
-- Per other worker: unclaimed live-leased buckets of generation $3 it owns
-- (the ones a claim may be placed on) and its load (those plus its own
-- pending claims in the generation).
SELECT w, sum(free)::int, sum(n)::int FROM (
    SELECT owner AS w, 1 AS free, 1 AS n FROM {{schema}}.lease_buckets
    WHERE subscription = $1 AND generation = $3 AND owner IS NOT NULL AND expires_at > now()
      AND claim_worker IS NULL
    UNION ALL
    SELECT claim_worker, 0, 1 FROM {{schema}}.lease_buckets
    WHERE subscription = $1 AND generation = $3 AND claim_worker IS NOT NULL
) x
WHERE w <> $2
GROUP BY w;

-- name: place_claims
-- The first phase of a handoff: mark $4[i] of owner $3[i]'s buckets of
-- generation $5 as claimed by this worker. The owner's next renew sees it and hands over.
-- No SKIP LOCKED: the owner is often mid-pass (the same notification woke
-- both), so this waits for its renew, bounded by a lock_timeout
-- (min(heartbeat/4, 1s)). It picks each owner's highest buckets, but locks
-- them in ascending bucket order, the order renew locks an owner's rows:
-- locking them highest first, it could hold a row the owner's renew waits
-- for while it waits for one the renew holds — a deadlock, which
-- PostgreSQL breaks by failing one of the two passes. The lock re-checks
-- the pick's conditions on the row's latest version (the owner too: the
-- owner picked for the bucket, found by its place in the arrays). Rows are
-- found by arrays of buckets, never by joins back to the table (see
-- release).
WITH want AS (SELECT * FROM unnest($3::text[], $4::int[]) AS w(owner, k)),
cand AS MATERIALIZED (
    SELECT array_agg(p.bucket) AS buckets, array_agg(w.owner) AS owners FROM want w CROSS JOIN LATERAL (
        SELECT l.bucket FROM {{schema}}.lease_buckets l
        WHERE l.subscription = $1 AND l.owner = w.owner AND l.generation = $5
          AND l.claim_worker IS NULL AND l.expires_at > now()
        ORDER BY l.bucket DESC
        LIMIT w.k) p
),
pick AS (
    SELECT l.bucket FROM {{schema}}.lease_buckets l
    WHERE l.subscription = $1 AND l.bucket = ANY((SELECT buckets FROM cand)::int[])
      AND l.owner = (SELECT owners FROM cand)[array_position((SELECT buckets FROM cand), l.bucket)]
      AND l.claim_worker IS NULL AND l.expires_at > now()
    ORDER BY l.bucket
    FOR UPDATE
)
UPDATE {{schema}}.lease_buckets l SET claim_worker = $2, claimed_at = now()
WHERE l.subscription = $1 AND l.bucket = ANY(ARRAY(SELECT bucket FROM pick))
RETURNING l.bucket, l.owner;

-- name: prune_workers
-- Forget workers gone for long that own and claim nothing.
DELETE FROM {{schema}}.lease_workers m
WHERE m.subscription = $1 AND m.worker <> $2 AND m.expires_at < now() - $3::interval
  AND NOT EXISTS (SELECT 1 FROM {{schema}}.lease_buckets l
                  WHERE l.subscription = m.subscription
                    AND (l.owner = m.worker OR l.claim_worker = m.worker));

-- name: notify
SELECT pg_notify($1, $2);

-- name: hand_over
-- The owner has drained: give up ownership. The pending claimant (if any)
-- activates on its next pass; nobody else may take it while that claim is
-- fresh. $3 bucket, $4 epoch.
UPDATE {{schema}}.lease_buckets SET owner = NULL, expires_at = NULL, heartbeat_at = now()
WHERE subscription = $1 AND owner = $2 AND bucket = $3 AND epoch = $4
RETURNING coalesce(claim_worker, '');

-- Statements that change several lease rows lock them first, in ascending
-- bucket order, as renew and place_claims do: rows locked in the order a
-- scan happens to find them could deadlock with a pass. They then find the
-- rows to change by the array of the buckets locked (an initplan, run
-- before the change touches a row), never by a join back to the locked
-- rows: on a table never analyzed the planner took those for one row and
-- rescanned the subscription for each, quadratic in the rows changed
-- (TestStatementsThatChangeManyRowsAreLinear).

-- name: release
-- $3 buckets. A pending claim on a released bucket survives: its claimant
-- gets it.
UPDATE {{schema}}.lease_buckets l SET owner = NULL, expires_at = NULL, heartbeat_at = now()
WHERE l.subscription = $1 AND l.owner = $2
  AND l.bucket = ANY(ARRAY(SELECT bucket FROM {{schema}}.lease_buckets
                           WHERE subscription = $1 AND owner = $2 AND bucket = ANY($3::int[])
                           ORDER BY bucket FOR UPDATE))
RETURNING l.bucket;

-- name: release_all
UPDATE {{schema}}.lease_buckets l SET owner = NULL, expires_at = NULL, heartbeat_at = now()
WHERE l.subscription = $1 AND l.owner = $2
  AND l.bucket = ANY(ARRAY(SELECT bucket FROM {{schema}}.lease_buckets
                           WHERE subscription = $1 AND owner = $2
                           ORDER BY bucket FOR UPDATE))
RETURNING l.bucket;

-- name: withdraw_all
UPDATE {{schema}}.lease_buckets l SET claim_worker = NULL, claimed_at = NULL
WHERE l.subscription = $1 AND l.claim_worker = $2
  AND l.bucket = ANY(ARRAY(SELECT bucket FROM {{schema}}.lease_buckets
                           WHERE subscription = $1 AND claim_worker = $2
                           ORDER BY bucket FOR UPDATE));

-- name: worker_delete
DELETE FROM {{schema}}.lease_workers WHERE subscription = $1 AND worker = $2;

-- name: guard
-- The fence: lock the lease row FOR SHARE so that no change of owner can
-- commit between this check and the caller's write. $2 bucket (not worker).
SELECT coalesce(owner, ''), epoch FROM {{schema}}.lease_buckets
WHERE subscription = $1 AND bucket = $2
FOR SHARE;

-- name: snapshot_buckets
SELECT bucket, bucket_count, coalesce(owner, ''), epoch, granted_at, expires_at, heartbeat_at,
    coalesce(claim_worker, ''), claimed_at, now(), generation, coalesce(cut_proposal, -1),
    drained_at IS NOT NULL
FROM {{schema}}.lease_buckets
WHERE subscription = $1
ORDER BY bucket;

-- name: snapshot_workers
WITH held AS MATERIALIZED (
    SELECT classid, objid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
)
SELECT m.worker, m.kind, m.joined_at, m.heartbeat_at, m.expires_at, m.expires_at > now(),
    coalesce(m.backend_pid, 0),
    (m.kind = 'session' AND NOT EXISTS (
        SELECT 1 FROM held h
        WHERE h.classid = ((m.lock_key >> 32) & 4294967295)::oid
          AND h.objid = (m.lock_key & 4294967295)::oid)),
    m.protocol
FROM {{schema}}.lease_workers m
WHERE m.subscription = $1
ORDER BY m.worker;

-- name: session_lock
SELECT pg_try_advisory_lock($1), pg_backend_pid();

-- name: session_check
-- Asked on the dedicated session itself: which of its locks $1 does it
-- still hold, and which backend answers (another than the locks': a
-- transaction pooler)?
SELECT ARRAY(
    SELECT k FROM unnest($1::bigint[]) AS k
    WHERE EXISTS (
        SELECT 1 FROM pg_locks
        WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted AND objsubid = 1
          AND classid = ((k >> 32) & 4294967295)::oid
          AND objid = (k & 4294967295)::oid)), pg_backend_pid();

-- name: session_identity
-- Where a connection is: its database, whether it is a standby, whether it
-- sees the session lock $1 granted to backend $2 in its own database (the
-- check that matters: it is what workers_view and confirm_dead rely on),
-- and the cluster's system identifier (needs EXECUTE on pg_control_system,
-- which PUBLIC has by default; see session_identity_plain).
SELECT current_database(), pg_is_in_recovery(),
    EXISTS (SELECT 1 FROM pg_locks
            WHERE pid = $2 AND locktype = 'advisory' AND granted AND objsubid = 1
              AND classid = ((($1::bigint) >> 32) & 4294967295)::oid
              AND objid = (($1::bigint) & 4294967295)::oid
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
    (SELECT system_identifier FROM pg_control_system())::text;

-- name: session_identity_plain
-- session_identity for a role that may not call pg_control_system.
SELECT current_database(), pg_is_in_recovery(),
    EXISTS (SELECT 1 FROM pg_locks
            WHERE pid = $2 AND locktype = 'advisory' AND granted AND objsubid = 1
              AND classid = ((($1::bigint) >> 32) & 4294967295)::oid
              AND objid = (($1::bigint) & 4294967295)::oid
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
    ''::text;

-- name: operator_lock
-- FenceOut: lock the lease row against every pass and fenced write, and
-- read its owner, epoch and time left (NULL when free or lapsed). $2 bucket.
SELECT coalesce(owner, ''), epoch,
    CASE WHEN owner IS NOT NULL AND expires_at > now() THEN expires_at - now() END
FROM {{schema}}.lease_buckets
WHERE subscription = $1 AND bucket = $2
FOR UPDATE;

-- name: operator_bump
-- FenceOut: fence out every holding granted so far. Owner, expiry and
-- claim stay: the owner's next renew returns the new epoch. $2 bucket.
UPDATE {{schema}}.lease_buckets SET epoch = epoch + 1
WHERE subscription = $1 AND bucket = $2
RETURNING epoch;

-- name: operator_lock_timeout
-- RequestHandoff, OperatorFence: a pass or a fenced write may hold the row
-- for a moment; never wait long.
SET LOCAL lock_timeout = '5s';

-- name: operator_request
-- RequestHandoff: place a pending claim in the name of live worker $3 on
-- bucket $2, held by a live owner other than $3 with no claim pending — the
-- first phase of the two-phase handoff, as a joining worker's pass places
-- it. Re-checked here, under the row lock: the decision was made on an
-- unlocked read. No row: something changed meanwhile.
UPDATE {{schema}}.lease_buckets l SET claim_worker = $3, claimed_at = now()
WHERE l.subscription = $1 AND l.bucket = $2
  AND l.owner IS NOT NULL AND l.owner <> $3 AND l.expires_at > now() AND l.claim_worker IS NULL
  AND EXISTS (SELECT 1 FROM {{schema}}.lease_workers m
              WHERE m.subscription = l.subscription AND m.worker = $3 AND m.expires_at > now())
RETURNING l.owner, l.epoch;

-- name: operator_subscriptions
-- ListSubscriptions: every subscription with lease rows, its N (the
-- serving generation's), its buckets of that generation held by a live
-- owner and its live workers. No $1.
SELECT l.subscription, coalesce(max(s.bucket_count), max(l.bucket_count))::int,
    (count(*) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at > now()
                        AND l.generation = coalesce(s.generation, 0)))::int,
    (SELECT count(*) FROM {{schema}}.lease_workers m
     WHERE m.subscription = l.subscription AND m.expires_at > now())::int
FROM {{schema}}.lease_buckets l
LEFT JOIN {{schema}}.subscriptions s ON s.subscription = l.subscription
GROUP BY l.subscription
ORDER BY l.subscription;

-- name: operator_bucket_count
-- BucketCount: the subscription's N (its serving generation's), 0 when it
-- has neither a subscriptions row nor lease rows.
SELECT coalesce((SELECT bucket_count FROM {{schema}}.subscriptions WHERE subscription = $1),
                (SELECT max(bucket_count) FROM {{schema}}.lease_buckets WHERE subscription = $1), 0)::int;

-- Resizes (docs/design/resize.md). A lease row's bucket column holds its slot,
-- generation * 65536 + bucket; the subscriptions row is the resize's state.
-- Lock order: the subscriptions row first (FOR UPDATE), then lease rows in
-- slot order; a pass never waits for the subscriptions row (SKIP LOCKED).

-- name: subscription_present
-- The fast path of EnsureBuckets: the subscription's serving generation and
-- its bucket count, no lock.
SELECT generation, bucket_count FROM {{schema}}.subscriptions WHERE subscription = $1;

-- name: subscription_create
-- Under the ensure lock: create the subscription with $2 buckets, or adopt
-- the lease rows a worker of an older version created (their count rules).
-- Returns the serving generation and its bucket count.
WITH found AS (
    SELECT max(bucket_count) AS n FROM {{schema}}.lease_buckets WHERE subscription = $1
), sub AS (
    INSERT INTO {{schema}}.subscriptions (subscription, bucket_count)
    SELECT $1, coalesce(found.n, $2::int) FROM found
    ON CONFLICT (subscription) DO NOTHING
    RETURNING generation, bucket_count
), gen AS (
    INSERT INTO {{schema}}.generations (subscription, generation, bucket_count, start_after, switched_at)
    SELECT $1, 0, bucket_count, 0, now() FROM sub
    ON CONFLICT DO NOTHING
), buckets AS (
    INSERT INTO {{schema}}.lease_buckets (subscription, bucket, bucket_count)
    SELECT $1, g, sub.bucket_count FROM sub, generate_series(0, sub.bucket_count - 1) AS g
    ON CONFLICT (subscription, bucket) DO NOTHING
)
SELECT generation, bucket_count FROM sub
UNION ALL
SELECT generation, bucket_count FROM {{schema}}.subscriptions WHERE subscription = $1
LIMIT 1;

-- name: resize_lock
-- Every resize transition's first lock.
SELECT generation, bucket_count, state, coalesce(next_bucket_count, 0), cut, requested_at,
    coalesce(requested_by, ''), switched_at, resize_id
FROM {{schema}}.subscriptions WHERE subscription = $1
FOR UPDATE;

-- name: resize_lock_skip
-- resize_lock for a pass, which must never wait for it: no row when a
-- transition is under way elsewhere.
SELECT generation, bucket_count, state, coalesce(next_bucket_count, 0), cut, requested_at,
    coalesce(requested_by, ''), switched_at, resize_id
FROM {{schema}}.subscriptions WHERE subscription = $1
FOR UPDATE SKIP LOCKED;

-- name: resize_share
-- An operator's fence (a checkpoint reset): no resize may begin meanwhile.
SELECT generation, bucket_count, state, coalesce(next_bucket_count, 0), cut, requested_at,
    coalesce(requested_by, ''), switched_at, resize_id
FROM {{schema}}.subscriptions WHERE subscription = $1
FOR SHARE;

-- name: resize_read
SELECT generation, bucket_count, state, coalesce(next_bucket_count, 0), cut, requested_at,
    coalesce(requested_by, ''), switched_at, resize_id
FROM {{schema}}.subscriptions WHERE subscription = $1;

-- name: resize_slots
-- ReadResize: the lease rows of generations $2 and $2 + 1.
SELECT bucket, coalesce(owner, ''), epoch, coalesce(cut_proposal, -1), drained_at IS NOT NULL
FROM {{schema}}.lease_buckets
WHERE subscription = $1 AND generation IN ($2, $2 + 1)
ORDER BY bucket;

-- name: resize_made
-- The resize that made generation $2 (0: none, or its row is gone).
SELECT coalesce((SELECT resize_id FROM {{schema}}.generations WHERE subscription = $1 AND generation = $2), 0);

-- name: resize_event_store
-- A resize reads the sequencer and writes checkpoints: the event store's
-- tables must be in the schema ($1, the schema's name).
SELECT count(*)::int FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname IN ('sequencer', 'checkpoints') AND c.relkind = 'r';

-- name: resize_index_valid
-- Whether the consumer-group index $2 exists in schema $1 and is valid.
SELECT i.indisvalid FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2;

-- name: resize_old_workers
-- Live workers of a protocol that predates resizes.
SELECT worker FROM {{schema}}.lease_workers
WHERE subscription = $1 AND expires_at > now() AND protocol < 2
ORDER BY worker;

-- name: resize_request
-- Under resize_lock, state steady: the resize to $2 buckets begins. The
-- next generation's lease rows are free; its checkpoints come with the cut.
WITH s AS (
    UPDATE {{schema}}.subscriptions SET state = 'sealing', next_bucket_count = $2, cut = NULL,
        requested_at = now(), requested_by = nullif($3, ''), switched_at = NULL, updated_at = now(),
        resize_id = resize_id + 1
    WHERE subscription = $1
    RETURNING generation, bucket_count, state, next_bucket_count, cut, requested_at, requested_by, switched_at,
        resize_id
), gen AS (
    INSERT INTO {{schema}}.generations (subscription, generation, bucket_count, resize_id)
    SELECT $1, generation + 1, $2, resize_id FROM s
    ON CONFLICT (subscription, generation) DO UPDATE SET bucket_count = EXCLUDED.bucket_count,
        start_after = NULL, end_at = NULL, created_at = now(), switched_at = NULL, retired_at = NULL,
        resize_id = EXCLUDED.resize_id
), buckets AS (
    INSERT INTO {{schema}}.lease_buckets (subscription, bucket, bucket_count, generation)
    SELECT $1, (s.generation + 1) * 65536 + g, $2, s.generation + 1 FROM s, generate_series(0, $2::int - 1) AS g
    ON CONFLICT (subscription, bucket) DO NOTHING
)
SELECT generation, bucket_count, state, coalesce(next_bucket_count, 0), cut, requested_at,
    coalesce(requested_by, ''), switched_at, resize_id
FROM s;

-- name: resize_guard
-- The fence of a resize's write to the slot's own row (a proposal, a
-- drain): guard, with the row lock the write needs.
SELECT coalesce(owner, ''), epoch FROM {{schema}}.lease_buckets
WHERE subscription = $1 AND bucket = $2
FOR UPDATE;

-- name: resize_propose
-- The holder's proposal for slot $2: the largest of its earlier one, its
-- cursor $3 and the head, read after the fence. A cursor above the head
-- (read from another server, before a failover) is refused: no proposal
-- (NULL) comes back with the head, and nothing is written, for the cut a
-- proposal makes becomes the new buckets' checkpoints.
WITH h AS (SELECT last_position AS head FROM {{schema}}.sequencer WHERE id = 1), p AS (
    UPDATE {{schema}}.lease_buckets
    SET cut_proposal = GREATEST(coalesce(cut_proposal, 0), $3::bigint, h.head)
    FROM h
    WHERE subscription = $1 AND bucket = $2 AND $3::bigint <= h.head
    RETURNING cut_proposal
)
SELECT (SELECT cut_proposal FROM p), coalesce((SELECT head FROM h), 0);

-- name: resize_proposals
-- Old generation $2: how many buckets have not proposed, and the largest
-- proposal.
SELECT (count(*) FILTER (WHERE cut_proposal IS NULL))::int, coalesce(max(cut_proposal), 0)
FROM {{schema}}.lease_buckets WHERE subscription = $1 AND generation = $2;

-- name: resize_decide
-- The last proposal decides the cut $3 for old generation $2 and new bucket
-- count $4: on the subscription, on both generations' records, and as the
-- new buckets' checkpoints (overwriting any a cancelled attempt left). The
-- old lease rows are not written (that would wait for every pass holding
-- one): each carries its proposal, at most C, which bounds a holding
-- granted on it until it learns C; a drain writes C on its row. A cut
-- above the event store's head is refused, as every checkpoint write is:
-- nothing is written, and whether it was (false: refused) comes back with
-- the head.
WITH h AS (SELECT last_position AS head FROM {{schema}}.sequencer WHERE id = 1),
ok AS (SELECT head FROM h WHERE $3::bigint <= head),
s AS (
    UPDATE {{schema}}.subscriptions SET state = 'cut', cut = $3, updated_at = now()
    WHERE subscription = $1 AND state = 'sealing' AND EXISTS (SELECT FROM ok)
), old AS (
    UPDATE {{schema}}.generations SET end_at = $3
    WHERE subscription = $1 AND generation = $2 AND EXISTS (SELECT FROM ok)
), new AS (
    UPDATE {{schema}}.generations SET start_after = $3
    WHERE subscription = $1 AND generation = $2 + 1 AND EXISTS (SELECT FROM ok)
), w AS (
    INSERT INTO {{schema}}.checkpoints AS c (subscription, bucket, position)
    SELECT $1, ($2 + 1) * 65536 + g, $3 FROM ok, generate_series(0, $4::int - 1) AS g
    ON CONFLICT (subscription, bucket) DO UPDATE SET position = EXCLUDED.position, updated_at = now()
)
SELECT EXISTS (SELECT FROM ok), coalesce((SELECT head FROM h), 0);

-- name: resize_drain_checkpoint
-- The drained slot's checkpoint at the cut, forward only, as a fenced
-- checkpoint write, bounded by the head as every checkpoint write is: the
-- stored value comes back (NULL when the cut is above the head, and
-- nothing was written), with the head.
WITH h AS (SELECT last_position AS head FROM {{schema}}.sequencer WHERE id = 1), w AS (
    INSERT INTO {{schema}}.checkpoints AS c (subscription, bucket, position)
    SELECT $1, $2, $3 FROM h WHERE $3::bigint <= h.head
    ON CONFLICT (subscription, bucket) DO UPDATE SET position = GREATEST(c.position, EXCLUDED.position), updated_at = now()
    RETURNING position
)
SELECT (SELECT position FROM w), coalesce((SELECT head FROM h), 0);

-- name: resize_drain
-- Slot $2 drained to the cut $3: released for good (no claim takes a
-- drained row).
UPDATE {{schema}}.lease_buckets SET drained_at = now(), cut = $3, owner = NULL, expires_at = NULL,
    heartbeat_at = now(), claim_worker = NULL, claimed_at = NULL
WHERE subscription = $1 AND bucket = $2;

-- name: resize_undrained
-- Old generation $2: its rows, its undrained rows, and the feeder classes
-- (bucket % $3, $3 = gcd(N, M)) that still have an undrained row.
SELECT count(*)::int, (count(*) FILTER (WHERE drained_at IS NULL))::int,
    coalesce(array_agg(DISTINCT (bucket % 65536) % $3::int) FILTER (WHERE drained_at IS NULL), '{}')
FROM {{schema}}.lease_buckets WHERE subscription = $1 AND generation = $2;

-- name: resize_switch
-- The first new bucket is ready: cancel is refused from here on.
WITH s AS (
    UPDATE {{schema}}.subscriptions SET state = 'switched', switched_at = now(), updated_at = now()
    WHERE subscription = $1 AND state = 'cut'
)
UPDATE {{schema}}.generations SET switched_at = now() WHERE subscription = $1 AND generation = $2 + 1;

-- name: resize_complete
-- Every old bucket drained: generation $2 + 1 with $3 buckets serves, $2
-- retires, and its rows go — those not locked at this moment (a zombie's
-- fence): later passes prune the rest.
WITH s AS (
    UPDATE {{schema}}.subscriptions SET generation = $2 + 1, bucket_count = $3, state = 'steady',
        next_bucket_count = NULL, cut = NULL, switched_at = coalesce(switched_at, now()), updated_at = now()
    WHERE subscription = $1 AND generation = $2
), old AS (
    UPDATE {{schema}}.generations SET retired_at = now() WHERE subscription = $1 AND generation = $2
), new AS (
    UPDATE {{schema}}.generations SET switched_at = coalesce(switched_at, now())
    WHERE subscription = $1 AND generation = $2 + 1
)
DELETE FROM {{schema}}.lease_buckets l
WHERE l.subscription = $1
  AND l.bucket = ANY(ARRAY(SELECT bucket FROM {{schema}}.lease_buckets
                           WHERE subscription = $1 AND generation = $2 ORDER BY bucket FOR UPDATE SKIP LOCKED));

-- name: prune_retired
-- Rows of generations below the serving one $2 that completion could not
-- delete (locked then). Never waits.
DELETE FROM {{schema}}.lease_buckets l
WHERE l.subscription = $1
  AND l.bucket = ANY(ARRAY(SELECT bucket FROM {{schema}}.lease_buckets
                           WHERE subscription = $1 AND bucket < $2 * 65536 ORDER BY bucket FOR UPDATE SKIP LOCKED));

-- name: resize_cancel_lock
-- Cancel, old generation $2: lock both generations' rows in slot order
-- first, the order a pass renews them in (the next statement's two parts
-- lock theirs in no order between them).
SELECT bucket FROM {{schema}}.lease_buckets
WHERE subscription = $1 AND generation IN ($2, $2 + 1)
ORDER BY bucket
FOR UPDATE;

-- name: resize_cancel_rows
-- Cancel, old generation $2: the next generation's rows go; the old rows'
-- proposals, cut and drains are cleared (a drained row is free again).
WITH gone AS (
    DELETE FROM {{schema}}.lease_buckets WHERE subscription = $1 AND generation = $2 + 1
)
UPDATE {{schema}}.lease_buckets l SET cut_proposal = NULL, cut = NULL, drained_at = NULL
WHERE l.subscription = $1
  AND l.bucket = ANY(ARRAY(SELECT bucket FROM {{schema}}.lease_buckets
                           WHERE subscription = $1 AND generation = $2 ORDER BY bucket FOR UPDATE));

-- name: resize_cancel_checkpoints
-- Cancel: the next generation's ($2) checkpoints, if the cut wrote them.
DELETE FROM {{schema}}.checkpoints
WHERE subscription = $1 AND bucket BETWEEN $2 * 65536 AND $2 * 65536 + 65535;

-- name: resize_cancel
-- Cancel: steady again at generation $2, its record of the next generation gone.
WITH gen AS (
    DELETE FROM {{schema}}.generations WHERE subscription = $1 AND generation = $2 + 1
), old AS (
    UPDATE {{schema}}.generations SET end_at = NULL WHERE subscription = $1 AND generation = $2
)
UPDATE {{schema}}.subscriptions SET state = 'steady', next_bucket_count = NULL, cut = NULL, updated_at = now()
WHERE subscription = $1
RETURNING generation, bucket_count, state, coalesce(next_bucket_count, 0), cut, requested_at,
    coalesce(requested_by, ''), switched_at, resize_id;

-- name: ownership_changes
-- The ownership record, newest first: subscription $1; generation $2 and
-- bucket $3 when not NULL (a bucket's changes; its generation's workers'
-- and resizes' too, which name no bucket); changes at or after $4, before
-- $5; at most $6.
SELECT id, at, kind, coalesce(generation, -1), coalesce(bucket, -1), coalesce(from_owner, ''),
    coalesce(to_owner, ''), coalesce(epoch, 0), evidence, by_role, by_app
FROM {{schema}}.ownership_changes
WHERE subscription = $1
  AND ($3::int IS NULL OR bucket IS NULL OR (generation = $2 AND bucket = $3))
  AND ($4::timestamptz IS NULL OR at >= $4) AND ($5::timestamptz IS NULL OR at < $5)
ORDER BY id DESC
LIMIT $6;

-- name: ownership_retention
SELECT keep FROM {{schema}}.ownership_retention;

-- name: ownership_retention_set
INSERT INTO {{schema}}.ownership_retention (keep) VALUES ($1::interval)
ON CONFLICT (one) DO UPDATE SET keep = excluded.keep;
