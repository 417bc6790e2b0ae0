-- One vocabulary (issue 12): one of a consumer group's N slices is a bucket.
-- Migration 0001 named the function that computes it cg_member; this one
-- renames it, and changes nothing else. A rename keeps the function's OID,
-- so anything built on it stays valid. (The consumer-group indexes do not
-- call it: they spell the expression out, see eventsource/queries.go.)

ALTER FUNCTION {{schema}}.cg_member(bigint, int) RENAME TO cg_bucket;

COMMENT ON FUNCTION {{schema}}.cg_bucket(bigint, int) IS
    'The bucket of a consumer-group hash in a group of n: the non-negative remainder ((hash % n) + n) % n.';
