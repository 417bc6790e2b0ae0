-- Bucket leases and worker membership. See docs/leases.md for the protocol.

-- One row per (subscription, bucket). owner IS NULL means free; a pending
-- two-phase claim is (claim_worker, claimed_at). epoch grows by one on every
-- change of owner and is the fencing token of the checkpoint writes. Every
-- time here is the database's clock (now()); workers' clocks are never stored.
CREATE TABLE {{schema}}.lease_buckets (
    subscription text        NOT NULL,
    bucket       integer     NOT NULL,
    shard_count  integer     NOT NULL,
    owner        text,
    epoch        bigint      NOT NULL DEFAULT 0,
    granted_at   timestamptz,
    expires_at   timestamptz,
    heartbeat_at timestamptz,
    claim_worker text,
    claimed_at   timestamptz,
    PRIMARY KEY (subscription, bucket),
    CHECK (shard_count > 0 AND bucket >= 0 AND bucket < shard_count),
    CHECK (epoch >= 0),
    CHECK (owner IS NULL OR expires_at IS NOT NULL),
    CHECK ((claim_worker IS NULL) = (claimed_at IS NULL))
);

CREATE INDEX lease_buckets_owner ON {{schema}}.lease_buckets (subscription, owner)
    WHERE owner IS NOT NULL;
CREATE INDEX lease_buckets_claim ON {{schema}}.lease_buckets (subscription, claim_worker)
    WHERE claim_worker IS NOT NULL;

-- One row per (subscription, worker) that has joined. A member is live while
-- expires_at > now(). A session-kind member also names the advisory lock its
-- dedicated session holds (lock_key) and that session's backend: the lock
-- being free is evidence that the worker is gone.
CREATE TABLE {{schema}}.lease_members (
    subscription text        NOT NULL,
    worker       text        NOT NULL,
    kind         text        NOT NULL,
    joined_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,
    backend_pid  integer,
    lock_key     bigint,
    PRIMARY KEY (subscription, worker),
    CHECK (kind IN ('row', 'session')),
    CHECK (kind = 'row' OR lock_key IS NOT NULL)
);
