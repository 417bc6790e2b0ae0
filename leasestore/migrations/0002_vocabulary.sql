-- One vocabulary (issue 12): a process taking part in a subscription's pool
-- is a worker, one of the subscription's N slices is a bucket. Migration 0001
-- said "member" and "shard"; this one renames, and changes nothing else:
-- rows, OIDs, row locks and advisory lock keys stay as they were.
--
-- A kumi binary older than this migration fails every pass against the
-- renamed tables (its statements name lease_members and shard_count), so it
-- renews nothing and its leases lapse: see docs/operations.md, upgrading.

ALTER TABLE {{schema}}.lease_members RENAME TO lease_workers;
ALTER TABLE {{schema}}.lease_workers RENAME CONSTRAINT lease_members_pkey TO lease_workers_pkey;
ALTER TABLE {{schema}}.lease_workers RENAME CONSTRAINT lease_members_kind_check TO lease_workers_kind_check;
ALTER TABLE {{schema}}.lease_workers RENAME CONSTRAINT lease_members_check TO lease_workers_check;

ALTER TABLE {{schema}}.lease_buckets RENAME COLUMN shard_count TO bucket_count;
