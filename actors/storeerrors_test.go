package actors

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
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
	o.Lease = leasestore.LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second}
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
	_, err := store.Pool().Exec(ctx, refuseWrites(q, "checkpoints", 2))
	require.NoError(t, err)
	seed(t, store, "acct", 5, 30)
	rec := newRecorder()
	o := groupOpts("restart", 1, rec, "w")
	// A lease that stays sure while the machine is busy, and a write only
	// when the timer says (every 20 ms). A write is tried only once
	// something was acked since the last: each refused one leaves acked
	// events out of the checkpoint.
	o.Lease = leasestore.LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second}
	o.CheckpointEvery = 10000
	w := startWorker(t, schema, "w", o)
	writes := func() int64 {
		var n int64
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM `+q+`.refused_checkpoints`).Scan(&n))
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

// A reader restarted while a function handler's run is in flight: the
// events of the run its handler finished were handled, though their acks
// never reached the reader. The new incarnation, at the same epoch, starts
// after them and delivers none of them again. (Before, it started after
// the reader's acked position, before the run, and delivered them again.)
// Here the run's last event is held by the handler, and meanwhile the
// reader's checkpoint write fails with an error that is not transient.
func TestAReaderRestartedDuringARunRedeliversNothingTheRunFinished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	q := pgx.Identifier{schema}.Sanitize()
	gate, started := make(chan struct{}), make(chan struct{}, 1)
	openGate := sync.OnceFunc(func() { close(gate) })
	defer openGate() // a failing test, too, lets the held handler go
	var mu sync.Mutex
	handled := map[string]int{} // by the event's data
	var gated []int             // the attempts of the held event's deliveries
	o := groupOpts("restartrun", 1, newRecorder(), "w")
	o.Handler = Func(func(ctx context.Context, d *Delivery) error {
		if d.Event.Type == "Gated" {
			mu.Lock()
			gated = append(gated, d.Attempt)
			mu.Unlock()
			select {
			case started <- struct{}{}:
			default:
			}
			<-gate
		}
		mu.Lock()
		handled[string(d.Event.Data)]++
		mu.Unlock()
		return nil
	})
	o.Lease = leasestore.LeaseOptions{TTL: 10 * time.Second, Heartbeat: time.Second, Margin: 3 * time.Second}
	o.CheckpointEvery, o.DatabaseTimeout, o.HandlerTimeout = 10000, time.Second, time.Hour
	w := startWorker(t, schema, "w", o)
	appended := 0
	appendOne := func(stream string, types ...string) {
		var evs []eventsource.EventData
		for _, ty := range types {
			evs = append(evs, eventsource.EventData{Type: ty, Data: []byte(fmt.Sprintf(`{"n": %d}`, appended))})
			appended++
		}
		_, err := store.Append(ctx, stream, eventsource.Any, evs)
		require.NoError(t, err)
	}
	checkpoint := func() int64 {
		cp, err := store.Checkpoint(ctx, "restartrun", 0)
		require.NoError(t, err)
		return cp
	}
	appendOne("acct-0", "Seeded") // a single delivery: the handler then takes runs
	pgtest.Eventually(t, waitLong, func() bool { return checkpoint() == 1 }, "the first event checkpointed")

	// Checkpoint writes wait for this lock and fail (transient: retried in
	// place); once it commits, the next one is refused (not transient).
	ck, err := store.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = ck.Rollback(ctx) }()
	_, err = ck.Exec(ctx, `LOCK TABLE `+q+`.checkpoints IN EXCLUSIVE MODE; `+refuseWrites(q, "checkpoints", 1))
	require.NoError(t, err)
	appendOne("acct-1", "Seeded") // acked, not checkpointed: the reader keeps writing
	pgtest.Eventually(t, waitLong, func() bool {
		var waits int64
		require.NoError(t, store.Pool().QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
			AND datname = current_database() AND query LIKE '%' || $1 || '%checkpoints%'`, schema).Scan(&waits))
		return waits > 0
	}, "a checkpoint write of the second event waits on the lock")
	// A run of five: four finished, the last held.
	appendOne("acct-2", "Seeded", "Seeded", "Seeded", "Seeded", "Gated")
	select {
	case <-started:
	case <-time.After(waitLong):
		t.Fatalf("the run's last event was not delivered%s", w.diagnose())
	}
	require.NoError(t, ck.Commit(ctx)) // the next write is refused: the reader restarts
	select {
	case <-started: // the new incarnation delivered the held event again: it was in flight
	case <-time.After(waitLong):
		t.Fatalf("the restarted reader did not deliver the held event%s", w.diagnose())
	}
	openGate()
	pgtest.Eventually(t, waitLong, func() bool { return checkpoint() == 7 }, "everything checkpointed%s", observed(w.diagnose))
	mu.Lock()
	defer mu.Unlock()
	for n := 2; n <= 5; n++ {
		require.Equal(t, 1, handled[fmt.Sprintf(`{"n": %d}`, n)], "event %d of the run handled once: %v", n, handled)
	}
	// The held event, given up by the restart, is sent again as the retry
	// it is, not as a new event.
	require.Equal(t, []int{0, 1}, gated, "the held event's attempts")
}

// refuseWrites is the SQL that makes the first n writes of rows of
// table in schema q (quoted) fail with a raised exception (SQLSTATE P0001:
// not transient); the sequence q.refused_<table> counts the writes tried,
// and its count survives their rollback.
func refuseWrites(q, table string, n int) string {
	return fmt.Sprintf(`CREATE SEQUENCE %[1]s.refused_%[2]s;
		CREATE FUNCTION %[1]s.refuse_%[2]s() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			IF nextval('%[1]s.refused_%[2]s') <= %[3]d THEN
				RAISE EXCEPTION '%[2]s write refused by the test';
			END IF;
			RETURN NEW;
		END $$;
		CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON %[1]s.%[2]s
			FOR EACH ROW EXECUTE FUNCTION %[1]s.refuse_%[2]s()`, q, table, n)
}

// A reader restarted while it writes an event's dead letter (the write
// failed with an error that is not transient) leaves the letter to its
// next incarnation at the same epoch, which writes it again and does not
// deliver the event again. (Before, the next incarnation delivered the
// event again from its first attempt, and with a retry budget each
// restart ran it through the whole budget again.)
func TestADeadLetterLeftByARestartedReaderIsWrittenNotDeliveredAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	q := pgx.Identifier{schema}.Sanitize()
	_, err := store.Pool().Exec(ctx, refuseWrites(q, "dead_letters", 1))
	require.NoError(t, err)
	var mu sync.Mutex
	var attempts []int // of the poison event, in delivery order
	rec := newRecorder()
	o := groupOpts("restartletter", 1, rec, "w")
	o.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
		d, ok := ctx.Message().(*Delivery)
		if !ok {
			return
		}
		if d.Event.Type == "Poison" {
			mu.Lock()
			attempts = append(attempts, d.Attempt)
			mu.Unlock()
			ctx.Respond(DeadLetter{Reason: "cannot be handled"})
			return
		}
		rec.begin("w", d.Event)
		rec.end("w", d.Event)
		ctx.Respond(Ack{})
	})
	w := startWorker(t, schema, "w", o)
	_, err = store.Append(ctx, "acct-p", eventsource.Any, []eventsource.EventData{{Type: "Poison", Data: []byte(`{}`)}})
	require.NoError(t, err)
	seed(t, store, "acct", 3, 6)
	letters := func() []eventsource.DeadLetter {
		dl, err := store.DeadLetters(ctx, "restartletter", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		return dl
	}
	pgtest.Eventually(t, waitLong, func() bool { return len(letters()) == 1 && rec.distinct() == 6 },
		"the poison event dead-lettered and the rest handled (letters %v, handled %d)%s",
		observed(letters), observed(rec.distinct), observed(w.diagnose))
	var tried int64
	require.NoError(t, store.Pool().QueryRow(ctx, `SELECT last_value FROM `+q+`.refused_dead_letters`).Scan(&tried))
	require.Equal(t, int64(2), tried, "the letter's write: refused once, then written again")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{0}, attempts, "the poison event delivered once: the restart wrote its letter again instead")
	require.Equal(t, 1, letters()[0].Attempts)
}
