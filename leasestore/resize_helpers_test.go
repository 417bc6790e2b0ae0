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

// setupResize is a lease schema with the event store beside it, as the
// runtime always has them: a resize reads the sequencer's head and writes
// checkpoints. indexes are the consumer-group indexes to build.
func setupResize(t *testing.T, indexes ...int) *testBundle {
	t.Helper()
	ctx := context.Background()
	b := setup(t)
	es, err := eventsource.New(b.pool, eventsource.Config{Schema: b.schema})
	require.NoError(t, err)
	require.NoError(t, es.Migrate(ctx))
	for _, n := range indexes {
		require.NoError(t, es.EnsureConsumerGroupIndex(ctx, n))
	}
	return b
}

// table is the quoted name of a table of the bundle's schema.
func (b *testBundle) table(name string) string { return pgx.Identifier{b.schema, name}.Sanitize() }

// setHead moves the event store's head, which a proposal reads.
func (b *testBundle) setHead(t *testing.T, head int64) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), "UPDATE "+b.table("sequencer")+" SET last_position = $1", head)
	require.NoError(t, err)
}

// checkpoint reads a slot's stored checkpoint (-1: none).
func (b *testBundle) checkpoint(t *testing.T, slot int) int64 {
	t.Helper()
	var pos int64 = -1
	err := b.pool.QueryRow(context.Background(), "SELECT position FROM "+b.table("checkpoints")+
		" WHERE subscription = $1 AND bucket = $2", b.sub, slot).Scan(&pos)
	if err != nil {
		require.ErrorIs(t, err, pgx.ErrNoRows)
	}
	return pos
}

func (b *testBundle) resize(t *testing.T) Resize {
	t.Helper()
	r, err := ReadResize(context.Background(), b.pool, b.schema, b.sub)
	require.NoError(t, err)
	return r
}

func (b *testBundle) request(t *testing.T, m int) Resize {
	t.Helper()
	r, err := RequestResize(context.Background(), b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: m, By: "test"})
	require.NoError(t, err)
	return r
}

// holderOf returns the store among stores that holds slot, and its lease.
func holderOf(t *testing.T, stores []*Store, slot int) (*Store, Lease) {
	t.Helper()
	for _, s := range stores {
		for _, l := range s.Held() {
			if l.Slot == slot {
				return s, l
			}
		}
	}
	t.Fatalf("nobody holds slot %d", slot)
	return nil, Lease{}
}

// holding runs rounds until some store holds slot (a handoff may have it
// in flight), and returns the holder and its lease.
func holding(t *testing.T, stores []*Store, slot int) (*Store, Lease) {
	t.Helper()
	pgtest.Eventually(t, 20*time.Second, func() bool {
		if _, ok := heldBy(stores, slot); ok {
			return true
		}
		round(t, stores)
		return false
	}, "nobody ever held slot %d", slot)
	return holderOf(t, stores, slot)
}

// settle runs rounds until every slot of the given generations' counts is
// held, and returns the last round's results.
func settle(t *testing.T, stores []*Store, want int) []PassResult {
	t.Helper()
	var res []PassResult
	pgtest.Eventually(t, 20*time.Second, func() bool {
		res = round(t, stores)
		held := 0
		for _, s := range stores {
			held += len(s.Held())
		}
		return held == want
	}, "the workers never held %d slots", want)
	return res
}

// proposeAll has every old slot's holder propose, heads rising, and
// returns the cut.
func proposeAll(t *testing.T, b *testBundle, stores []*Store, n int) int64 {
	t.Helper()
	ctx := context.Background()
	var cut int64
	id := b.resize(t).ID
	for i := range n {
		head := int64(100 + 10*i)
		b.setHead(t, head)
		s, l := holderOf(t, stores, i)
		require.False(t, l.Bound.Resizing, "slot %d: no bound carried before its proposal", i)
		bound, err := s.ProposeCut(ctx, i, l.Epoch, head-5)
		require.NoError(t, err)
		if i < n-1 {
			require.Equal(t, Bound{Resize: id, Resizing: true, Limit: head}, bound, "slot %d: the head read after the fence", i)
			require.Equal(t, ResizeSealing, b.resize(t).State)
		} else {
			cut = head
			require.Equal(t, Bound{Resize: id, Resizing: true, Limit: cut, Decided: true}, bound, "the last proposal decides")
		}
	}
	return cut
}

func heldBy(stores []*Store, slot int) (*Store, bool) {
	for _, s := range stores {
		for _, l := range s.Held() {
			if l.Slot == slot {
				return s, true
			}
		}
	}
	return nil, false
}

// The refusals of RequestResize, each typed, each writing nothing.

func (b *testBundle) resizeGeneration(ctx context.Context) int {
	r, err := ReadResize(ctx, b.pool, b.schema, b.sub)
	if err != nil {
		return -1
	}
	return r.Generation
}
