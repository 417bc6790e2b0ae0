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

// A reader restarted by its supervisor (here its checkpoint write failed
// with an error that is not transient, twice) keeps its lease and epoch:
// the new incarnation starts after what the old one acked, and delivers
// none of it again, though none of it reached the checkpoint. (Before, it
// started at the checkpoint and delivered everything again after each
// restart.)
func TestARestartedReaderRedeliversNothingItAcked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	q := pgx.Identifier{schema}.Sanitize()
	// The bucket's first two checkpoint writes fail with a raised
	// exception (SQLSTATE P0001: not transient); the count survives their
	// rollback.
	_, err := store.Pool().Exec(ctx, `CREATE SEQUENCE `+q+`.refused;
		CREATE FUNCTION `+q+`.refuse_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('`+q+`.refused') <= 2 THEN
				RAISE EXCEPTION 'checkpoint write refused by the test';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON `+q+`.checkpoints
			FOR EACH ROW EXECUTE FUNCTION `+q+`.refuse_checkpoint()`)
	require.NoError(t, err)
	seed(t, store, "acct", 5, 30)
	rec := newRecorder()
	o := groupOpts("restart", 1, rec, "w")
	// A lease that stays sure while the machine is busy, and a write only
	// when the timer says (every 20 ms). A write is tried only once
	// something was acked since the last: each refused one leaves acked
	// events out of the checkpoint.
	o.Lease = LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second}
	o.CheckpointEvery = 10000
	w := startWorker(t, schema, "w", o)
	writes := func() int64 {
		var n int64
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+q+`.refused`).Scan(&n))
		return n
	}
	pgtest.Eventually(t, waitLong, func() bool {
		cp, err := store.Checkpoint(ctx, "restart", 0)
		return err == nil && cp == 30
	}, "the checkpoint lands after two refused writes (writes %d, handled %d)%s", observed(writes), observed(rec.distinct), observed(w.diagnose))
	require.Equal(t, 30, rec.distinct(), "every event handled")
	require.Greater(t, writes(), int64(2), "two writes refused, the reader restarted after each")
	require.Equal(t, "w@1", holders(t, schema, "restart")[0], "held at one epoch throughout")
	require.Zero(t, rec.duplicates(), "nothing acked was delivered again")
}
