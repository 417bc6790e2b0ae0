package leasestore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A pass reads the subscription (its heartbeat statement) before it locks
// and claims rows. A resize requested in between, and a proposal written
// on a slot that the pass then claims, must not leave the pass reporting a
// steady subscription beside a lease whose row carries a bound: the
// runtime takes a steady subscription for "no bound", and the reader of
// that slot would deliver beyond the proposal (the bound rule of
// docs/design/resize.md, lemma L2).
func TestAPassNeverReportsASubscriptionOlderThanTheRowsItClaims(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 4)
		config := func(worker string) Config {
			c := b.config(kind, 2, worker)
			c.Heartbeat, c.NoListen = 10*time.Second, true // the pass waits below, well within one heartbeat
			return c
		}
		h := b.open(t, config("h"))
		res := pass(t, h)
		require.Len(t, res.Owned, 2, "alone, h holds both buckets")
		w := b.open(t, config("w"))
		require.NoError(t, w.EnsureBuckets(ctx))

		// Hold w's worker row: w's next pass reads the subscription (steady)
		// and then waits in its heartbeat, before it claims anything.
		blocker, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = blocker.Rollback(ctx) }()
		_, err = blocker.Exec(ctx, "SELECT 1 FROM "+b.table("lease_workers")+" WHERE subscription = $1 AND worker = 'w' FOR UPDATE", b.sub)
		require.NoError(t, err)
		type passed struct {
			res PassResult
			err error
		}
		done := make(chan passed, 1)
		go func() {
			res, err := w.Pass(ctx)
			done <- passed{res, err}
		}()
		waiting := func() bool {
			var n int
			err := b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'
				AND query LIKE '%INSERT INTO %lease_workers%' AND query LIKE '%'||$1||'%'`, b.schema).Scan(&n)
			return err == nil && n > 0
		}
		eventually(t, 20*time.Second, waiting, func() string { return "w's pass never waited for its worker row" })

		// Meanwhile: the resize is requested, h proposes for bucket 1 and
		// releases it.
		b.setHead(t, 40)
		b.request(t, 4)
		l := leaseOf(t, h, 1)
		bound, err := h.ProposeCut(ctx, 1, l.Epoch, 0)
		require.NoError(t, err)
		require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: 40}, bound)
		require.NoError(t, h.Release(ctx, []int{1}))
		require.NoError(t, blocker.Rollback(ctx))

		got := <-done
		require.NoError(t, got.err)
		claimed := leaseOf(t, nil, 1, got.res.Claimed...)
		require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: 40}, claimed.Bound, "the row's proposal")
		require.Equal(t, ResizeSealing, got.res.Resize.State,
			"the pass claimed bucket 1 bounded by its proposal but reports the subscription as %s", got.res.Resize.State)
		require.Equal(t, 4, got.res.Resize.NextBuckets)
	})
}

// leaseOf returns the lease of slot among leases, or among s's held ones
// when s is not nil.
func leaseOf(t *testing.T, s *Store, slot int, leases ...Lease) Lease {
	t.Helper()
	if s != nil {
		leases = s.Held()
	}
	for _, l := range leases {
		if l.Slot == slot {
			return l
		}
	}
	t.Fatalf("slot %d not among %v", slot, fmt.Sprint(leases))
	return Lease{}
}
