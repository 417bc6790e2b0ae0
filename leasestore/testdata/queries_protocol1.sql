-- Every statement of the lease store, one place to read and review them.
-- A "-- name: x" line starts statement x. {{schema}} is the quoted schema.
-- Every time is the database's now(): the transaction's start, the same for
-- every statement of a pass, and never later than the moment a row is
-- judged, so it errs towards "not yet expired".
-- $1 is always the subscription, $2 (where present) this worker.

-- name: shards_present
-- The fast path of EnsureShards: rows and their shard counts, no lock.
SELECT count(*)::int, coalesce(min(bucket_count), 0), coalesce(max(bucket_count), 0)
FROM {{schema}}.lease_buckets WHERE subscription = $1;

-- name: ensure_lock
-- Serialises EnsureShards of one subscription across processes.
SELECT pg_advisory_xact_lock($1);

-- name: bucket_counts
SELECT DISTINCT bucket_count FROM {{schema}}.lease_buckets WHERE subscription = $1;

-- name: ensure_rows
-- $2 shard count.
INSERT INTO {{schema}}.lease_buckets (subscription, bucket, bucket_count)
SELECT $1, g, $2 FROM generate_series(0, $2::int - 1) AS g
ON CONFLICT (subscription, bucket) DO NOTHING;

-- name: member_heartbeat
-- Join or heartbeat; monotonic, so a delayed heartbeat never moves expiry
-- back. $3 kind, $4 ttl, $5 session backend pid, $6 session lock key.
-- joined reports a member that was absent or expired before this statement.
WITH prev AS (
    SELECT expires_at > now() AS live
    FROM {{schema}}.lease_workers WHERE subscription = $1 AND worker = $2
), up AS (
    INSERT INTO {{schema}}.lease_workers AS m
        (subscription, worker, kind, heartbeat_at, expires_at, backend_pid, lock_key)
    VALUES ($1, $2, $3, now(), now() + $4::interval, $5, $6)
    ON CONFLICT (subscription, worker) DO UPDATE SET
        kind = EXCLUDED.kind,
        heartbeat_at = GREATEST(m.heartbeat_at, EXCLUDED.heartbeat_at),
        expires_at = GREATEST(m.expires_at, EXCLUDED.expires_at),
        backend_pid = EXCLUDED.backend_pid,
        lock_key = EXCLUDED.lock_key
    RETURNING 1
)
SELECT coalesce((SELECT NOT live FROM prev), true) AS joined FROM up;

-- name: members_view
-- The other members, whether each is live, and whether a session member's
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
-- must drain and hand over); a stale claim (claimant not a live member, or
-- older than $4) is recovered here. Locks in bucket order. $3 ttl.
WITH mine AS (
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
)
UPDATE {{schema}}.lease_buckets l SET
    heartbeat_at = GREATEST(l.heartbeat_at, now()),
    expires_at = CASE WHEN mine.pending THEN l.expires_at
                      ELSE GREATEST(l.expires_at, now() + $3::interval) END,
    claim_worker = CASE WHEN mine.pending THEN l.claim_worker END,
    claimed_at = CASE WHEN mine.pending THEN l.claimed_at END
FROM mine
WHERE l.subscription = $1 AND l.bucket = mine.bucket
RETURNING l.bucket, l.epoch, l.expires_at, mine.pending,
    (mine.prev_claim IS NOT NULL AND NOT mine.pending) AS recovered,
    now() AS db_now;

-- name: my_claims
SELECT bucket FROM {{schema}}.lease_buckets WHERE subscription = $1 AND claim_worker = $2 ORDER BY bucket;

-- name: confirm_dead
-- Liveness evidence, made atomic: a session member whose advisory lock this
-- transaction can take has no session. The lock is held until commit, so the
-- member cannot come back under the same key while its buckets move.
-- $2 workers, $3 their lock keys.
WITH dead AS (
    SELECT d.w FROM unnest($2::text[], $3::bigint[]) AS d(w, k)
    WHERE pg_try_advisory_xact_lock(d.k)
), marked AS (
    UPDATE {{schema}}.lease_workers m SET expires_at = LEAST(m.expires_at, now())
    FROM dead WHERE m.subscription = $1 AND m.worker = dead.w
    RETURNING m.worker
)
SELECT coalesce(array_agg(w), '{}') FROM dead;

-- name: claim
-- Take up to $3 buckets: this worker's own claims whose owner handed over
-- (or lapsed) first, then free buckets, then expired ones or those of owners
-- proven dead ($4). A bucket under another live claimant's fresh claim is
-- left to that claimant. SKIP LOCKED: never wait behind a rival's claim or
-- an in-flight fenced write. $5 start offset, $6 claim stale-after, $7
-- shard count, $8 ttl.
WITH c AS (
    SELECT l.bucket, l.owner AS prev_owner, (l.claim_worker IS NOT DISTINCT FROM $2) AS was_mine,
        (l.expires_at < now()) AS prev_expired
    FROM {{schema}}.lease_buckets l
    WHERE l.subscription = $1
      AND l.owner IS DISTINCT FROM $2
      AND (l.owner IS NULL OR l.expires_at < now() OR l.owner = ANY($4::text[]))
      AND (l.claim_worker IS NULL OR l.claim_worker = $2 OR l.claim_worker = ANY($4::text[])
           OR l.claimed_at < now() - $6::interval
           OR NOT EXISTS (SELECT 1 FROM {{schema}}.lease_workers m
                          WHERE m.subscription = l.subscription AND m.worker = l.claim_worker
                            AND m.expires_at > now()))
    ORDER BY (l.claim_worker IS NOT DISTINCT FROM $2) DESC, (l.owner IS NULL) DESC,
        (l.bucket + $5::int) % $7::int
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {{schema}}.lease_buckets l SET
    owner = $2, epoch = l.epoch + 1, granted_at = now(), heartbeat_at = now(),
    expires_at = now() + $8::interval, claim_worker = NULL, claimed_at = NULL
FROM c
WHERE l.subscription = $1 AND l.bucket = c.bucket
RETURNING l.bucket, l.epoch, l.expires_at, coalesce(c.prev_owner, ''), c.was_mine,
    coalesce(c.prev_expired, false), now() AS db_now;

-- name: withdraw_claims
-- Withdraw $3 of this worker's pending claims, those not yet handed over first.
UPDATE {{schema}}.lease_buckets l SET claim_worker = NULL, claimed_at = NULL
FROM (SELECT bucket FROM {{schema}}.lease_buckets
      WHERE subscription = $1 AND claim_worker = $2
      ORDER BY (owner IS NULL), bucket DESC
      LIMIT $3 FOR UPDATE SKIP LOCKED) w
WHERE l.subscription = $1 AND l.bucket = w.bucket
RETURNING l.bucket;

-- name: placement_lock
-- Serialises two-phase claim placement of one subscription, so that two
-- claimants never both count the same surplus: the next placer's loads
-- read what the previous one committed. It is the last lock a pass takes
-- and is held only to its commit, so the wait is short and cannot deadlock.
SELECT pg_advisory_xact_lock($1);

-- name: loads
-- Per other worker: unclaimed live-leased buckets it owns (the ones a claim
-- may be placed on) and its load (those plus its own pending claims).
SELECT w, sum(free)::int, sum(n)::int FROM (
    SELECT owner AS w, 1 AS free, 1 AS n FROM {{schema}}.lease_buckets
    WHERE subscription = $1 AND owner IS NOT NULL AND expires_at > now() AND claim_worker IS NULL
    UNION ALL
    SELECT claim_worker, 0, 1 FROM {{schema}}.lease_buckets
    WHERE subscription = $1 AND claim_worker IS NOT NULL
) x
WHERE w <> $2
GROUP BY w;

-- name: place_claims
-- The first phase of a handoff: mark $4[i] of owner $3[i]'s buckets as
-- claimed by this worker. The owner's next renew sees it and hands over.
-- No SKIP LOCKED: the owner is often mid-pass (the same notification woke
-- both), so this waits for its renew, bounded by a lock_timeout
-- (min(heartbeat/4, 1s)). It picks each owner's highest buckets, but locks
-- them in ascending bucket order, the order renew locks an owner's rows:
-- locking them highest first, it could hold a row the owner's renew waits
-- for while it waits for one the renew holds — a deadlock, which
-- PostgreSQL breaks by failing one of the two passes. The lock re-checks
-- the pick's conditions on the row's latest version.
WITH want AS (SELECT * FROM unnest($3::text[], $4::int[]) AS w(owner, k)),
cand AS (
    SELECT p.bucket, w.owner FROM want w CROSS JOIN LATERAL (
        SELECT l.bucket FROM {{schema}}.lease_buckets l
        WHERE l.subscription = $1 AND l.owner = w.owner
          AND l.claim_worker IS NULL AND l.expires_at > now()
        ORDER BY l.bucket DESC
        LIMIT w.k) p
),
pick AS (
    SELECT l.bucket FROM {{schema}}.lease_buckets l
    JOIN cand ON cand.bucket = l.bucket AND cand.owner = l.owner
    WHERE l.subscription = $1 AND l.claim_worker IS NULL AND l.expires_at > now()
    ORDER BY l.bucket
    FOR UPDATE OF l
)
UPDATE {{schema}}.lease_buckets l SET claim_worker = $2, claimed_at = now()
FROM pick
WHERE l.subscription = $1 AND l.bucket = pick.bucket
RETURNING l.bucket, l.owner;

-- name: prune_members
-- Forget members gone for long that own and claim nothing.
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
-- scan happens to find them could deadlock with a pass.

-- name: release
-- $3 buckets. A pending claim on a released bucket survives: its claimant
-- gets it.
UPDATE {{schema}}.lease_buckets l SET owner = NULL, expires_at = NULL, heartbeat_at = now()
FROM (SELECT bucket FROM {{schema}}.lease_buckets
      WHERE subscription = $1 AND owner = $2 AND bucket = ANY($3::int[])
      ORDER BY bucket FOR UPDATE) x
WHERE l.subscription = $1 AND l.bucket = x.bucket AND l.owner = $2
RETURNING l.bucket;

-- name: release_all
UPDATE {{schema}}.lease_buckets l SET owner = NULL, expires_at = NULL, heartbeat_at = now()
FROM (SELECT bucket FROM {{schema}}.lease_buckets
      WHERE subscription = $1 AND owner = $2
      ORDER BY bucket FOR UPDATE) x
WHERE l.subscription = $1 AND l.bucket = x.bucket AND l.owner = $2
RETURNING l.bucket;

-- name: withdraw_all
UPDATE {{schema}}.lease_buckets l SET claim_worker = NULL, claimed_at = NULL
FROM (SELECT bucket FROM {{schema}}.lease_buckets
      WHERE subscription = $1 AND claim_worker = $2
      ORDER BY bucket FOR UPDATE) x
WHERE l.subscription = $1 AND l.bucket = x.bucket AND l.claim_worker = $2;

-- name: member_delete
DELETE FROM {{schema}}.lease_workers WHERE subscription = $1 AND worker = $2;

-- name: guard
-- The fence: lock the lease row FOR SHARE so that no change of owner can
-- commit between this check and the caller's write. $2 bucket (not worker).
SELECT coalesce(owner, ''), epoch FROM {{schema}}.lease_buckets
WHERE subscription = $1 AND bucket = $2
FOR SHARE;

-- name: snapshot_buckets
SELECT bucket, bucket_count, coalesce(owner, ''), epoch, granted_at, expires_at, heartbeat_at,
    coalesce(claim_worker, ''), claimed_at, now()
FROM {{schema}}.lease_buckets
WHERE subscription = $1
ORDER BY bucket;

-- name: snapshot_members
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
          AND h.objid = (m.lock_key & 4294967295)::oid))
FROM {{schema}}.lease_workers m
WHERE m.subscription = $1
ORDER BY m.worker;

-- name: session_lock
SELECT pg_try_advisory_lock($1), pg_backend_pid();

-- name: session_check
-- Asked on the dedicated session itself: does it still hold its lock, and
-- which backend answers (another than the lock's: a transaction pooler)?
SELECT EXISTS (
    SELECT 1 FROM pg_locks
    WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted AND objsubid = 1
      AND classid = ((($1::bigint) >> 32) & 4294967295)::oid
      AND objid = (($1::bigint) & 4294967295)::oid), pg_backend_pid();

-- name: session_identity
-- Where a connection is: its database, whether it is a standby, whether it
-- sees the session lock $1 granted to backend $2 in its own database (the
-- check that matters: it is what members_view and confirm_dead rely on),
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
-- RequestHandoff: place a pending claim in the name of live member $3 on
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
-- ListSubscriptions: every subscription with lease rows, its N, its buckets
-- held by a live owner and its live members. No $1.
SELECT l.subscription, max(l.bucket_count)::int,
    (count(*) FILTER (WHERE l.owner IS NOT NULL AND l.expires_at > now()))::int,
    (SELECT count(*) FROM {{schema}}.lease_workers m
     WHERE m.subscription = l.subscription AND m.expires_at > now())::int
FROM {{schema}}.lease_buckets l
GROUP BY l.subscription
ORDER BY l.subscription;

-- name: operator_bucket_count
-- BucketCount: the subscription's N, 0 without lease rows.
SELECT coalesce(max(bucket_count), 0)::int FROM {{schema}}.lease_buckets WHERE subscription = $1;
