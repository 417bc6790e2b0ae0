package leasestore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// An owner's renew locks its rows in bucket order; a claimant placing
// claims on them must lock in the same order, or each can hold a row the
// other waits for: a deadlock, which PostgreSQL breaks by failing one of
// the two — often the owner's pass, so its leases go unrenewed.
func TestPlacingClaimsLocksInTheRenewsOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.open(t, b.config(KindRow, 2, "a"))
	require.Len(t, pass(t, a).Owned, 2)
	_ = b.open(t, b.config(KindRow, 2, "b")) // a live worker to claim for

	// The owner's renew, mid-way: it holds bucket 0 and will want bucket 1.
	renew, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = renew.Rollback(ctx) }()
	lockRow := "SELECT bucket FROM " + pgx.Identifier{b.schema}.Sanitize() + ".lease_buckets WHERE subscription = $1 AND bucket = $2 FOR UPDATE"
	_, err = renew.Exec(ctx, lockRow, b.sub, 0)
	require.NoError(t, err)

	// The claimant places claims on both of a's buckets.
	place, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = place.Rollback(ctx) }()
	var placePID int32
	require.NoError(t, place.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&placePID))
	placed := make(chan error, 1)
	go func() {
		rows, err := place.Query(ctx, a.st.get("place_claims"), b.sub, "b", []string{"a"}, []int32{2}, 0)
		if err == nil {
			_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (int32, error) {
				var bucket int32
				var owner string
				err := r.Scan(&bucket, &owner)
				return bucket, err
			})
		}
		placed <- err
	}()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var waiting bool
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted)", placePID).Scan(&waiting)
		return err == nil && waiting
	}, "the claimant waits for the owner's row")

	// The renew goes on to bucket 1: it must not find it held by the
	// claimant, who waits for bucket 0.
	_, err = renew.Exec(ctx, lockRow, b.sub, 1)
	require.NoError(t, err, "the owner's renew deadlocked with the claimant's placement")
	require.NoError(t, renew.Commit(ctx))
	require.NoError(t, <-placed, "the claimant's placement deadlocked with the owner's renew")
	require.NoError(t, place.Commit(ctx))
}

// A fenced write that finds its bucket taken marks it in the view, which a
// pass has just made: the pass must be done with the map before it lets
// others reach it (a data race the race detector caught in the fault
// suite). Here the Guard learns of the pass only through the view, as a
// reader's checkpoint write does.
func TestAFailedFenceAndAPassDoNotRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.open(t, b.config(KindRow, 4, "a"))
	pass(t, a)
	for range 5 {
		held := a.Held()[0]
		passed := make(chan struct{})
		go func() {
			defer close(passed)
			_, _ = passPatiently(t, a) // renews bucket 0 at its epoch
		}()
		pgtest.Eventually(t, 30*time.Second, func() bool { return a.Held()[0].Expires.After(held.Expires) },
			"the pass renewed bucket 0")
		// An operator fences every earlier holder out: a's fenced write of
		// bucket 0 at its epoch fails, and marks the pass's view.
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := FenceOut(ctx, tx, b.schema, b.sub, 0, true)
			return err
		}))
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return a.Guard(ctx, tx, 0, held.Epoch) })
		require.ErrorIs(t, err, eventsource.ErrFenceLost)
		<-passed
		pass(t, a) // takes bucket 0 back at its new epoch
	}
}

// A pass below its share takes the placement lock after it has renewed
// (locked) its own rows. Another placer holding the placement lock may wait
// for one of those rows (its place_claims, or, during a resize, its
// placement in the second generation): a cycle. The pass must wait for the
// placement lock no longer than for the owners' rows — it places nothing
// this time — rather than deadlock, which PostgreSQL broke by failing the
// whole pass (TestResizeLifecycle/row/8to9 once: "place claims: deadlock
// detected").
func TestAPlacerWaitingForThisPassesRowsDoesNotFailIt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config(KindRow, 8, "a")
	cfg.Heartbeat = time.Second // its waits for locks: 250 ms, under PostgreSQL's deadlock_timeout
	a := b.open(t, cfg)
	bw := b.open(t, b.config(KindRow, 8, "b"))
	require.NoError(t, bw.EnsureBuckets(ctx))
	q := pgx.Identifier{b.schema}.Sanitize()
	_, err := b.pool.Exec(ctx, "UPDATE "+q+".lease_buckets SET owner = CASE WHEN bucket < 2 THEN 'a' ELSE 'b' END, "+
		"epoch = 1, granted_at = now(), expires_at = now() + interval '1 hour' WHERE subscription = $1", b.sub)
	require.NoError(t, err)

	// The other placer: it holds the placement lock ...
	other, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = other.Rollback(ctx) }()
	_, err = other.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", a.keys.place)
	require.NoError(t, err)

	// ... when a's pass, holding its two rows, wants it to place claims on b's surplus.
	passed := make(chan error, 1)
	go func() { _, err := a.Pass(ctx); passed <- err }()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var waiting bool
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "+
			"AND objid = ($1::bigint & 4294967295)::oid)", a.keys.place).Scan(&waiting)
		select {
		case err := <-passed: // it already gave up waiting
			passed <- err
			return true
		default:
		}
		return err == nil && waiting
	}, "a's pass never waited for the placement lock")
	// The other placer now waits for a's row.
	locked := make(chan error, 1)
	go func() {
		_, err := other.Exec(ctx, "SELECT 1 FROM "+q+".lease_buckets WHERE subscription = $1 AND bucket = 0 FOR UPDATE", b.sub)
		locked <- err
	}()
	passErr, lockErr := <-passed, <-locked // both done before anything can fail the test and roll back other
	require.NoError(t, passErr, "a's pass")
	require.NoError(t, lockErr, "the other placer gets the row once the pass ended")
	require.Len(t, a.Held(), 2, "the pass renewed its rows and placed nothing")
}

// A cancel locks every lease row of both generations. A pass may hold a
// row it claimed (SKIP LOCKED, in no order) while it waits, placing claims,
// for a lower one: if the cancel holds that one and waits for the claimed
// one, PostgreSQL breaks the cycle by failing one of the two — the cancel,
// when it waited first (TestResizeLocksNeverDeadlock/session once: "cancel
// resize: deadlock detected"). A cancel is a transaction with no effect
// until it commits: it is tried again.
func TestACancelCaughtInADeadlockIsTriedAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupResize(t, 4)
	a := b.open(t, b.config(KindRow, 2, "a"))
	require.NoError(t, a.EnsureBuckets(ctx))
	b.request(t, 4)
	q := b.table("lease_buckets")

	// A pass holds new bucket 1, which it claimed, and is about to wait
	// for new bucket 0, placing a claim on it.
	pass, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = pass.Rollback(ctx) }()
	_, err = pass.Exec(ctx, "SET LOCAL deadlock_timeout = '30s'") // PostgreSQL fails the cancel, not this
	require.NoError(t, err)
	lockRow := "SELECT bucket FROM " + q + " WHERE subscription = $1 AND bucket = $2 FOR UPDATE"
	_, err = pass.Exec(ctx, lockRow, b.sub, eventsource.Slot(1, 1))
	require.NoError(t, err)

	cancelled := make(chan error, 1)
	go func() { _, err := CancelResize(ctx, b.pool, b.schema, b.sub); cancelled <- err }()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var waiting bool
		err := pgtest.Pool(t).QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "+
			"WHERE NOT l.granted AND a.query LIKE '%lease_buckets%' AND a.pid <> pg_backend_pid())").Scan(&waiting)
		return err == nil && waiting
	}, "the cancel never waited for the pass's row")
	_, passErr := pass.Exec(ctx, lockRow, b.sub, eventsource.Slot(1, 0)) // the cycle: the cancel, waiting first, is failed
	commitErr := pass.Commit(ctx)
	cancelErr := <-cancelled
	require.NoError(t, passErr, "the pass goes on")
	require.NoError(t, commitErr)
	require.NoError(t, cancelErr, "and the cancel, tried again, succeeds")
	require.Equal(t, ResizeSteady, b.resize(t).State)
}

// A pass holds its own worker row from its heartbeat to its commit. Two
// passes that each find the other's session gone (a session reopening:
// its locks are free for a moment, and on a shared session connection
// every worker of the process is gone at once) confirm each other dead:
// each holds its own row and wants the other's, a cycle PostgreSQL broke
// by failing one pass (TestResizeLocksNeverDeadlock/session once). The
// confirmation skips a row that is locked — its worker is mid-pass — and
// leaves it to the next pass. Checked to fail (40P01) without SKIP LOCKED.
func TestConfirmDeadNeverWaitsForARow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.open(t, b.config(KindSession, 2, "a"))
	_ = b.open(t, b.config(KindSession, 2, "b"))
	c := b.open(t, b.config(KindSession, 2, "c"))
	heartbeat := "UPDATE " + pgx.Identifier{b.schema}.Sanitize() + ".lease_workers SET heartbeat_at = now() " +
		"WHERE subscription = $1 AND worker = $2"
	// Keys nobody holds: the confirmations find these sessions gone.
	const keyA, keyB, keyC = int64(-7_100_001), int64(-7_100_002), int64(-7_100_003)

	// Each pass, mid-way: its heartbeat holds its own row.
	begin := func(worker string) pgx.Tx {
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		_, err = tx.Exec(ctx, "SELECT set_config('kumi.protocol', '2', true)")
		require.NoError(t, err)
		_, err = tx.Exec(ctx, heartbeat, b.sub, worker)
		require.NoError(t, err)
		return tx
	}
	passA, passB := begin("a"), begin("b")

	// a confirms b and c dead while b confirms a: each would wait for the
	// other's row.
	type answer struct {
		dead []string
		err  error
	}
	confirm := func(tx pgx.Tx, workers []string, keys []int64) answer {
		var dead []string
		err := tx.QueryRow(ctx, a.st.get("confirm_dead"), b.sub, workers, keys).Scan(&dead)
		if err != nil {
			_ = tx.Rollback(ctx) // lets the other side go on
		}
		return answer{dead, err}
	}
	byA := make(chan answer, 1)
	go func() { byA <- confirm(passA, []string{"b", "c"}, []int64{keyB, keyC}) }()
	fromB := confirm(passB, []string{"a"}, []int64{keyA})
	fromA := <-byA
	require.NoError(t, fromA.err, "a's confirmation")
	require.NoError(t, fromB.err, "b's confirmation")
	require.Equal(t, []string{"c"}, fromA.dead, "b is mid-pass: only c is confirmed")
	require.Empty(t, fromB.dead, "a is mid-pass")
	require.NoError(t, passA.Commit(ctx))
	require.NoError(t, passB.Commit(ctx))

	// With no pass of b's under way, the next confirmation marks it.
	var dead []string
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, c.st.get("confirm_dead"), b.sub, []string{"b"}, []int64{keyB}).Scan(&dead)
	}))
	require.Equal(t, []string{"b"}, dead)
}
