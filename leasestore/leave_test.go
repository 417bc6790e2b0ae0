package leasestore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// A leave locks the rows its worker owns, then those it claimed. Another
// transaction that holds a claimed row and then waits for an owned one —
// as another worker's pass may, renewing its own bucket and then
// withdrawing its claim on the leaver's — closes a cycle, which PostgreSQL
// breaks by failing the side that waited first: here the leave (the other
// side checks for deadlocks only after 10 s). The failed try changed
// nothing; the leave is tried again and succeeds. (Before, Stop failed
// with "leasestore: leave: ERROR: deadlock detected (SQLSTATE 40P01)", as
// a CI run's actors test did at its cleanup.)
func TestLeaveIsTriedAgainWhenADeadlockFailsIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	w := b.open(t, b.config(KindRow, 2, "w"))
	require.Len(t, pass(t, w).Owned, 2)
	table := pgx.Identifier{b.schema, "lease_buckets"}.Sanitize()
	// Bucket 1 moves to x, with w's claim on it: w owns 0 and claims 1.
	_, err := b.pool.Exec(ctx, `UPDATE `+table+` SET owner = 'x', epoch = epoch + 1, claim_worker = 'w', claimed_at = now()
		WHERE subscription = $1 AND bucket = 1`, b.sub)
	require.NoError(t, err)

	holder, err := pgtest.Pool(t).Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Rollback(ctx) })
	_, err = holder.Exec(ctx, "SET LOCAL deadlock_timeout = '10s'")
	require.NoError(t, err)
	lockRow := func(bucket int) error {
		_, err := holder.Exec(ctx, `SELECT 1 FROM `+table+` WHERE subscription = $1 AND bucket = $2 FOR UPDATE`, b.sub, bucket)
		return err
	}
	require.NoError(t, lockRow(1))

	left := make(chan error, 1)
	go func() { left <- w.Leave(ctx) }()
	// The leave has locked bucket 0 and waits for bucket 1.
	waiting := func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%claim_worker = NULL%' AND query LIKE '%' || $1 || '%'`,
			pgx.Identifier{b.schema}.Sanitize()).Scan(&n)
		return err == nil && n == 1
	}
	pgtest.Eventually(t, 30*time.Second, waiting, "the leave waits for bucket 1")
	// Closing the cycle: the leave, which waited first, is failed, and its
	// lock on bucket 0 goes to the holder.
	require.NoError(t, lockRow(0), "the holder gets bucket 0 once the deadlock fails the leave")
	require.NoError(t, holder.Rollback(ctx))

	select {
	case err := <-left:
		require.NoError(t, err, "the leave is tried again after the deadlock failed it")
	case <-time.After(30 * time.Second):
		t.Fatal("the leave did not return")
	}
	var owned, claimed int
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE owner = 'w'), count(*) FILTER (WHERE claim_worker = 'w')
		FROM `+table+` WHERE subscription = $1`, b.sub).Scan(&owned, &claimed))
	require.Zero(t, owned, "w owns nothing after its leave")
	require.Zero(t, claimed, "w's claim is withdrawn")
}
