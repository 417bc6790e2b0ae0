package leasestore

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// passHold is a pgx tracer that holds a lease pass back between its commit
// and its apply. Armed, it blocks the next pass's COMMIT — runPipelined's,
// in capitals; a pgx.Tx commits with "commit" — once the database has
// answered it, until released: the pass has committed, and its view is not
// yet the store's.
type passHold struct {
	armed     atomic.Bool
	committed chan struct{} // closed when the held pass has committed
	release   chan struct{} // closed by the test: the pass applies
}

// passCommit marks, in a query's context, runPipelined's COMMIT.
type passCommit struct{}

// arm holds the next pass back, with fresh channels.
func (h *passHold) arm() {
	h.committed, h.release = make(chan struct{}), make(chan struct{})
	h.armed.Store(true)
}

func (h *passHold) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if d.SQL == "COMMIT" {
		return context.WithValue(ctx, passCommit{}, true)
	}
	return ctx
}

func (h *passHold) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	if ctx.Value(passCommit{}) != nil && d.Err == nil && h.armed.CompareAndSwap(true, false) {
		close(h.committed)
		<-h.release
	}
}

// passBatchCommit marks, in a batch's context, a batch whose COMMIT
// committed: a PassBatcher's shared round trip, which carries its passes'
// commits (KUMI_LEASE_BATCHED).
type passBatchCommit struct{ committed atomic.Bool }

func (h *passHold) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return context.WithValue(ctx, passBatchCommit{}, &passBatchCommit{})
}

func (h *passHold) TraceBatchQuery(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	if m, ok := ctx.Value(passBatchCommit{}).(*passBatchCommit); ok && d.SQL == "COMMIT" && d.Err == nil {
		m.committed.Store(true)
	}
}

func (h *passHold) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceBatchEndData) {
	m, ok := ctx.Value(passBatchCommit{}).(*passBatchCommit)
	if ok && m.committed.Load() && d.Err == nil && h.armed.CompareAndSwap(true, false) {
		close(h.committed)
		<-h.release
	}
}

// heldPasses returns a store of cfg on a pool of its own, and the hold that
// can hold its passes back between commit and apply.
func heldPasses(t *testing.T, cfg Config) (*Store, *passHold) {
	t.Helper()
	pc, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	hold := &passHold{}
	pc.MaxConns, pc.ConnConfig.Tracer = 4, hold
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return openOn(t, pool, cfg), hold
}

// passHeld runs a pass that hold holds back after its commit, and returns
// once it has committed; apply lets it apply, and returns its result.
func passHeld(t *testing.T, s *Store, hold *passHold) (apply func() PassResult) {
	t.Helper()
	hold.arm()
	type passed struct {
		res PassResult
		err error
	}
	done := make(chan passed, 1)
	go func() {
		res, err := passPatiently(t, s) // an abandoned pass commits nothing: the next one is held
		done <- passed{res, err}
	}()
	released := false
	release := func() {
		if !released {
			released = true
			close(hold.release)
		}
	}
	t.Cleanup(func() { release(); <-done })
	select {
	case <-hold.committed:
	case p := <-done:
		done <- p
		t.Fatalf("the held pass ended before its commit: %v", p.err)
	case <-time.After(30 * time.Second):
		t.Fatal("the held pass never committed")
	}
	return func() PassResult {
		t.Helper()
		release()
		p := <-done
		done <- p
		require.NoError(t, p.err, "the held pass")
		return p.res
	}
}

// A fenced write that finds its bucket taken marks it lost in the view.
// When it lands between a pass's commit and its apply — the pass renewed
// the bucket at its epoch just before the fence moved on — the view the
// pass applies must keep the mark: it was built from rows read before the
// failure, and EnsureHeld said yes again to a bucket the worker knew it
// had lost, until the next pass.
func TestAFenceLostWhileAPassAppliesStaysLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := b.config(KindRow, 1, "a")
	cfg.NoListen = true
	a, hold := heldPasses(t, cfg)
	held := pass(t, a).Owned[0]
	require.NoError(t, a.EnsureHeld(0))

	apply := passHeld(t, a, hold) // renews bucket 0 at its epoch
	// An operator fences every earlier holder out: a's fenced write of
	// bucket 0 at its epoch fails, and marks the view.
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		_, err := FenceOut(ctx, tx, b.schema, b.sub, 0, true)
		return err
	}))
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return a.Guard(ctx, tx, 0, held.Epoch) })
	require.ErrorIs(t, err, eventsource.ErrFenceLost)
	require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld, "the failed fence marks the view")

	res := apply()
	require.Equal(t, held.Epoch, leaseOf(t, nil, 0, res.Owned...).Epoch, "the pass renewed bucket 0 at its old epoch")
	require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld,
		"the pass that renewed bucket 0 before its fence failed forgot the failure: EnsureHeld passes for a lost bucket")

	res = pass(t, a) // the next pass finds it at its new epoch
	require.Equal(t, []int{0}, res.Lost)
	require.Greater(t, leaseOf(t, nil, 0, res.Claimed...).Epoch, held.Epoch)
	require.NoError(t, a.EnsureHeld(0))
}
