package actors

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// A transient database error on a checkpoint write (here: the write waits
// on a row lock past DatabaseTimeout) must not restart the reader: a
// restart forgets what it acked since its last checkpoint and delivers it
// again. The write is retried in place, and lands once the database lets
// it.
func TestATransientCheckpointWriteFailureRedeliversNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	// The checkpoint row, locked (uncommitted) before the worker starts:
	// every checkpoint write of the bucket waits on it.
	tx, err := store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema}.Sanitize()+`.checkpoints (subscription, bucket, position) VALUES ('cpfail', 0, 0)`)
	require.NoError(t, err)
	seed(t, store, "acct", 5, 30)
	rec := newRecorder()
	o := groupOpts("cpfail", 1, rec, "w")
	o.DatabaseTimeout = time.Second
	// A lease that stays sure while the machine is busy: an unsure lease
	// stops the reader, which is not what this test is about.
	o.Lease = LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second}
	startWorker(t, schema, "w", o)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 30 }, "the events handled")
	var waits int64
	lockWaits := func() int64 {
		_ = store.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database() AND query LIKE '%' || $1 || '%checkpoints%'`, schema).Scan(&waits)
		return waits
	}
	pgtest.Eventually(t, waitLong, func() bool { return lockWaits() > 0 }, "a checkpoint write waits on the lock")
	pgtest.Eventually(t, waitLong, func() bool { return lockWaits() == 0 }, "that write timed out")
	require.NoError(t, tx.Rollback(ctx))
	pgtest.Eventually(t, waitLong, func() bool {
		cp, err := store.Checkpoint(ctx, "cpfail", 0)
		return err == nil && cp == 30
	}, "the checkpoint lands once the lock is gone")
	require.Zero(t, rec.duplicates(), "nothing acked was delivered again")
}
