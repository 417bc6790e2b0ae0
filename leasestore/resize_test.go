package leasestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// TestResizeLifecycle walks a resize through every state for both kinds
// and (N, M) up, down, with a common divisor and coprime: the request
// makes the new slots (standby), the proposals decide the cut, drains in a
// random order switch it exactly when some new bucket's feeders have all
// drained, and the last completes it.
func TestResizeLifecycle(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		for _, c := range []struct{ n, m int }{{8, 32}, {32, 8}, {8, 12}, {8, 9}, {1, 4}, {4, 1}, {3, 21}} {
			t.Run(fmt.Sprintf("%dto%d", c.n, c.m), func(t *testing.T) { resizeLifecycle(t, kind, c.n, c.m) })
		}
	})
}

func resizeLifecycle(t *testing.T, kind Kind, n, m int) {
	ctx := context.Background()
	b := setupResize(t, m)
	stores := []*Store{b.open(t, b.config(kind, n, "a")), b.open(t, b.config(kind, n, "b"))}
	settle(t, stores, n)

	r := b.request(t, m)
	require.Equal(t, Resize{Subscription: b.sub, ID: 1, Generation: 0, Buckets: n, State: ResizeSealing, NextBuckets: m,
		RequestedAt: r.RequestedAt, RequestedBy: "test"}, r)
	res := settle(t, stores, n+m)
	for _, p := range res {
		require.Equal(t, ResizeSealing, p.Resize.State)
		require.Equal(t, n, p.Resize.Buckets)
		require.Equal(t, m, p.Resize.NextBuckets)
	}
	for _, s := range stores {
		for _, l := range s.Held() {
			if l.Generation == 1 {
				require.False(t, l.Ready, "new slot %d on standby before the cut", l.Slot)
				require.Equal(t, m, l.Buckets)
				require.Equal(t, eventsource.Slot(1, l.Bucket), l.Slot)
			} else {
				require.True(t, l.Ready)
				require.Equal(t, n, l.Buckets)
			}
		}
		// Each generation is balanced on its own.
		old, next := 0, 0
		for _, l := range s.Held() {
			if l.Generation == 0 {
				old++
			} else {
				next++
			}
		}
		require.LessOrEqual(t, old, FairShare(n, 2), "worker %s", s.Worker())
		require.LessOrEqual(t, next, FairShare(m, 2), "worker %s", s.Worker())
	}

	cut := proposeAll(t, b, stores, n)
	r = b.resize(t)
	require.Equal(t, ResizeCut, r.State)
	require.Equal(t, cut, r.Cut)
	require.True(t, r.CutDecided)
	for j := range m {
		require.Equal(t, cut, b.checkpoint(t, eventsource.Slot(1, j)), "new bucket %d starts after the cut", j)
	}
	// A proposal after the decision returns the cut and writes nothing.
	s, l := holderOf(t, stores, 0)
	b.setHead(t, cut+1000)
	bound, err := s.ProposeCut(ctx, 0, l.Epoch, cut+500)
	require.NoError(t, err)
	require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: cut, Decided: true}, bound)
	require.EqualValues(t, 100, b.resize(t).Old[0].Proposal, "the proposal did not move")
	// The pass carries the decided bound on every old lease.
	round(t, stores)
	for _, s := range stores {
		for _, l := range s.Held() {
			if l.Generation == 0 {
				require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: cut, Decided: true}, l.Bound)
			}
		}
	}

	drained := map[int]bool{}
	order := rand.New(rand.NewPCG(uint64(n), uint64(m))).Perm(n)
	for k, i := range order {
		s, l := holding(t, stores, i)
		require.NoError(t, s.Drain(ctx, i, l.Epoch, cut))
		drained[i] = true
		require.ErrorIs(t, s.EnsureHeld(i), ErrNotHeld, "a drained slot leaves the view")
		require.Equal(t, cut, b.checkpoint(t, i))
		if k == len(order)-1 {
			break
		}
		round(t, stores)
		r := b.resize(t)
		anyReady := false
		for j, st := range r.New {
			want := true
			for _, f := range Feeders(n, m, j) {
				want = want && drained[f]
			}
			anyReady = anyReady || want
			require.Equal(t, want, st.Ready, "new bucket %d after drains %v", j, drained)
			if _, held := heldBy(stores, st.Slot); held {
				hs, hl := holderOf(t, stores, st.Slot)
				require.Equal(t, want, hl.Ready, "worker %s's lease of new bucket %d", hs.Worker(), j)
			}
		}
		if anyReady {
			require.Equal(t, ResizeSwitched, r.State, "the drain that completes some feeder set switches")
		} else {
			require.Equal(t, ResizeCut, r.State)
		}
		for _, o := range r.Old {
			require.Equal(t, drained[o.Bucket], o.Drained)
			if o.Drained {
				_, held := heldBy(stores, o.Slot)
				require.False(t, held, "drained slot %d claimed again", o.Slot)
			}
		}
	}

	r = b.resize(t)
	require.Equal(t, ResizeSteady, r.State)
	require.Equal(t, 1, r.Generation)
	require.Equal(t, m, r.Buckets)
	require.False(t, r.SwitchedAt.IsZero())
	var oldRows int
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.table("lease_buckets")+
		" WHERE subscription = $1 AND generation = 0", b.sub).Scan(&oldRows))
	require.Zero(t, oldRows, "the retired generation's lease rows are gone")
	var endAt, startAfter int64
	var retired, switched bool
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT o.end_at, o.retired_at IS NOT NULL, n.start_after, n.switched_at IS NOT NULL FROM "+
		b.table("generations")+" o JOIN "+b.table("generations")+" n ON n.subscription = o.subscription AND n.generation = 1 "+
		"WHERE o.subscription = $1 AND o.generation = 0", b.sub).Scan(&endAt, &retired, &startAfter, &switched))
	require.Equal(t, [4]any{cut, true, cut, true}, [4]any{endAt, retired, startAfter, switched})

	// Completed: every new slot is held and ready; a worker started with
	// the old N serves the new generation, with no error.
	late := b.open(t, b.config(kind, n, "late"))
	stores = append(stores, late)
	res = settle(t, stores, m)
	for i, s := range stores {
		require.Equal(t, 1, res[i].Resize.Generation)
		for _, l := range s.Held() {
			require.Equal(t, 1, l.Generation)
			require.True(t, l.Ready)
			require.Equal(t, m, l.Buckets)
			require.NoError(t, s.EnsureHeld(l.Slot))
		}
	}
}

func TestResizeRequestRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupResize(t, 4)
	a := b.open(t, b.config(KindRow, 2, "a"))
	pass(t, a)
	req := func(m int, evict bool) error {
		_, err := RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: m, EvictOldWorkers: evict})
		return err
	}
	unchanged := func() {
		t.Helper()
		r := b.resize(t)
		require.Equal(t, ResizeSteady, r.State)
		require.Equal(t, 0, r.Generation)
		var rows int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.table("lease_buckets")+" WHERE subscription = $1", b.sub).Scan(&rows))
		require.Equal(t, 2, rows, "nothing written")
	}

	for _, m := range []int{0, -1, MaxBuckets + 1} {
		var cfg *kumierr.ConfigError
		require.ErrorAs(t, req(m, false), &cfg, "M = %d", m)
		require.Equal(t, "leasestore.ResizeRequest.Buckets", cfg.Field)
		require.Contains(t, cfg.Error(), fmt.Sprint(MaxBuckets))
	}
	require.ErrorIs(t, req(2, false), ErrSameBuckets)
	var byErr *kumierr.ConfigError
	_, err := RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: 4, By: "ops\x1b[2J"})
	require.ErrorAs(t, err, &byErr)
	require.Equal(t, "leasestore.ResizeRequest.By", byErr.Field)
	_, err = RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: "nobody", Buckets: 4})
	require.ErrorIs(t, err, ErrNoSubscription)

	var missing *kumierr.ConfigError
	require.ErrorAs(t, req(3, false), &missing)
	require.Equal(t, kumierr.ConfigError{Field: "leasestore.ResizeRequest.Buckets", Value: 3, Err: ErrIndexMissing,
		Reason: "the consumer-group index events_cg_3 does not exist: build it first (kumi migrate --group-size 3, as the tables' owner)"}, *missing)
	require.ErrorIs(t, req(3, false), ErrIndexMissing)
	// An index left invalid, as by an interrupted CREATE INDEX CONCURRENTLY.
	_, err = b.pool.Exec(ctx, "CREATE INDEX events_cg_5 ON "+b.table("events")+" (category)")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE pg_index SET indisvalid = false WHERE indexrelid = to_regclass($1)",
		b.table("events_cg_5"))
	require.NoError(t, err)
	require.ErrorAs(t, req(5, false), &missing)
	require.ErrorIs(t, missing, ErrIndexMissing)
	require.Contains(t, missing.Reason, "events_cg_5 is invalid (an interrupted concurrent build)")

	// A live protocol-1 worker.
	p1 := newProtocolOne(b.pool, b.schema, b.sub, "older", 2, 30*time.Second, nil)
	require.NoError(t, p1.heartbeat(ctx))
	var old *OldWorkersError
	require.ErrorAs(t, req(4, false), &old)
	require.Equal(t, []string{"older"}, old.Workers)
	require.ErrorIs(t, req(4, false), ErrOldWorkers)
	unchanged()

	// The generation limit.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.table("subscriptions")+" SET generation = 32767")
	require.NoError(t, err)
	var cfg *kumierr.ConfigError
	require.ErrorAs(t, req(4, true), &cfg)
	require.Equal(t, "leasestore.ResizeRequest.Buckets", cfg.Field)
	require.Contains(t, cfg.Error(), "32767 times")
	_, err = b.pool.Exec(ctx, "UPDATE "+b.table("subscriptions")+" SET generation = 0")
	require.NoError(t, err)
	unchanged()

	// Evicting: the request goes through.
	r, err := RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: 4, EvictOldWorkers: true})
	require.NoError(t, err)
	require.Equal(t, ResizeSealing, r.State)

	// A lease store used on its own: no event store beside it.
	lone := setup(t)
	pass(t, lone.open(t, lone.config(KindRow, 2, "a")))
	_, err = RequestResize(ctx, lone.pool, lone.schema, ResizeRequest{Subscription: lone.sub, Buckets: 4})
	require.ErrorIs(t, err, ErrNoEventStore)
}

// Two requests at once: one wins, the other is refused naming it; a
// request in every state of a resize is refused.
func TestConcurrentResizeIsRefused(t *testing.T) {
	t.Parallel()
	forEachKind(t, concurrentResizeIsRefused)
}

func concurrentResizeIsRefused(t *testing.T, kind Kind) {
	ctx := context.Background()
	b := setupResize(t, 4, 6)
	a := b.open(t, b.config(kind, 2, "a"))
	pass(t, a)
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, m := range []int{4, 6} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: m, By: fmt.Sprint("op", i)})
		}()
	}
	wg.Wait()
	won := slices.IndexFunc(errs, func(err error) bool { return err == nil })
	require.NotEqual(t, -1, won, "one request wins: %v", errs)
	var busy *ResizeInProgressError
	require.ErrorAs(t, errs[1-won], &busy)
	require.Equal(t, fmt.Sprint("op", won), busy.RequestedBy)
	require.Equal(t, []int{4, 6}[won], busy.To)
	require.Equal(t, ResizeSealing, busy.State)
	require.ErrorIs(t, errs[1-won], ErrResizeInProgress)
	m := []int{4, 6}[won]

	refused := func(state ResizeState) {
		t.Helper()
		_, err := RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: 10 - m})
		require.ErrorAs(t, err, &busy)
		require.Equal(t, state, busy.State)
	}
	refused(ResizeSealing)
	settle(t, []*Store{a}, 2+m)
	cut := proposeAll(t, b, []*Store{a}, 2)
	refused(ResizeCut)
	l := a.Held()[0]
	require.NoError(t, a.Drain(ctx, l.Slot, l.Epoch, cut))
	refused(ResizeSwitched)
}

// Cancel before the switch puts everything back; after it, it is refused
// and changes nothing.
func TestCancel(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 3, 4)
		stores := []*Store{b.open(t, b.config(kind, 2, "a")), b.open(t, b.config(kind, 2, "b"))}
		settle(t, stores, 2)
		cancel := func() (Resize, error) { return CancelResize(ctx, b.pool, b.schema, b.sub) }
		_, err := cancel()
		require.ErrorIs(t, err, ErrNoResize)
		backToSteady := func() {
			t.Helper()
			r := b.resize(t)
			require.Equal(t, ResizeSteady, r.State)
			require.Equal(t, 0, r.Generation)
			for j := range 4 {
				require.EqualValues(t, -1, b.checkpoint(t, eventsource.Slot(1, j)), "new checkpoints gone")
			}
			res := settle(t, stores, 2)
			for _, p := range res {
				for _, l := range p.Owned {
					require.Equal(t, 0, l.Generation, "new slots dropped")
					require.False(t, l.Bound.Resizing, "old readers unbounded again")
				}
			}
			var gens int
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+b.table("generations")+
				" WHERE subscription = $1", b.sub).Scan(&gens))
			require.Equal(t, 1, gens)
		}

		// In sealing.
		b.request(t, 4)
		settle(t, stores, 6)
		s, l := holderOf(t, stores, 0)
		_, err = s.ProposeCut(ctx, 0, l.Epoch, 0)
		require.NoError(t, err)
		r, err := cancel()
		require.NoError(t, err)
		require.Equal(t, ResizeSteady, r.State)
		backToSteady()
		bound, err := s.ProposeCut(ctx, 0, s.Held()[0].Epoch, 0)
		require.NoError(t, err)
		require.Equal(t, Bound{Resize: r.ID}, bound, "no resize: no bound (the bound names the last resize)")

		// In cut, with a slot drained (2 → 3: every new bucket waits for
		// both old ones): it is free again, and resumes from C.
		b.request(t, 3)
		settle(t, stores, 5)
		cut := proposeAll(t, b, stores, 2)
		s, l = holderOf(t, stores, 0)
		require.NoError(t, s.Drain(ctx, 0, l.Epoch, cut))
		require.Equal(t, ResizeCut, b.resize(t).State)
		_, err = cancel()
		require.NoError(t, err)
		for j := range 3 {
			require.EqualValues(t, -1, b.checkpoint(t, eventsource.Slot(1, j)), "new checkpoints gone")
		}
		backToSteady()
		require.Equal(t, cut, b.checkpoint(t, 0), "the drained slot resumes from the cut")
		s, l = holderOf(t, stores, 1)
		require.ErrorIs(t, s.Drain(ctx, 1, l.Epoch, cut), ErrNoResize, "a drain after a cancel is refused")
		require.NoError(t, s.EnsureHeld(1), "and the slot stays held")

		// In switched (2 → 4: new buckets 1 and 3 wait for old bucket 1
		// alone): refused, nothing changes.
		b.request(t, 4)
		settle(t, stores, 6)
		cut = proposeAll(t, b, stores, 2)
		s, l = holderOf(t, stores, 1)
		require.NoError(t, s.Drain(ctx, 1, l.Epoch, cut))
		before := b.resize(t)
		require.Equal(t, ResizeSwitched, before.State)
		_, err = cancel()
		var late *ResizeSwitchedError
		require.ErrorAs(t, err, &late)
		require.ErrorIs(t, err, ErrResizeSwitched)
		require.Equal(t, [2]int{2, 4}, [2]int{late.From, late.To})
		require.Equal(t, before, b.resize(t), "nothing changed")
	})
}

// The holder of an old slot dies before its drain commits: the slot's next
// holder inherits the bound (the cut) from its lease, drains it, and its
// drain completes the resize; the dead holder's drain is fenced out.
func TestCrashOfTheDrainingHolder(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 4)
		a := b.open(t, shortTTL(b.config(kind, 2, "a")))
		bw := b.open(t, shortTTL(b.config(kind, 2, "b")))
		stores := []*Store{a, bw}
		settle(t, stores, 2)
		b.request(t, 4)
		settle(t, stores, 6)
		cut := proposeAll(t, b, stores, 2)
		held := a.Held()
		var old Lease
		for _, l := range held {
			if l.Generation == 0 {
				old = l
			}
		}
		require.NotZero(t, old.Epoch, "a holds an old slot")
		// a dies mid-drain: it never renews again; a session kind's session goes too.
		if featuresOf(t, kind).sessionEvidence {
			var killed bool
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_terminate_backend($1, 5000)", a.session.backendPID()).Scan(&killed))
			require.True(t, killed)
		}
		var took Lease
		pgtest.Eventually(t, 20*time.Second, func() bool {
			res := pass(t, bw)
			for _, l := range res.Claimed {
				if l.Slot == old.Slot {
					took = l
				}
			}
			return took.Epoch > 0
		}, "the dead holder's old slot was never taken over")
		require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: cut, Decided: true}, took.Bound, "the next holder inherits the cut")
		require.Greater(t, took.Epoch, old.Epoch)

		var lost *LostFenceError
		require.ErrorAs(t, a.Drain(ctx, old.Slot, old.Epoch, cut), &lost, "the dead holder's drain is fenced out")
		require.ErrorIs(t, a.Drain(ctx, old.Slot, old.Epoch, cut), eventsource.ErrFenceLost)
		_, err := a.ProposeCut(ctx, old.Slot, old.Epoch, 0)
		require.ErrorAs(t, err, &lost)

		for _, l := range bw.Held() {
			if l.Generation == 0 {
				require.NoError(t, bw.Drain(ctx, l.Slot, l.Epoch, cut))
			}
		}
		r := b.resize(t)
		require.Equal(t, ResizeSteady, r.State)
		require.Equal(t, 1, r.Generation)
		require.Equal(t, cut, b.checkpoint(t, old.Slot))
	})
}

// A protocol-1 worker (the version before resizes, its own statements)
// runs as before on a subscription never resized; once a resize is
// requested its heartbeat — the first statement of its every pass — is
// refused with KU001, and so after the resize completes.
func TestFeeders(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		n, m, j int
		want    []int
	}{
		{8, 32, 11, []int{3}}, {32, 8, 3, []int{3, 11, 19, 27}}, {8, 12, 5, []int{1, 5}},
		{8, 9, 4, []int{0, 1, 2, 3, 4, 5, 6, 7}}, {1, 4, 3, []int{0}}, {4, 1, 0, []int{0, 1, 2, 3}},
	} {
		require.Equal(t, c.want, Feeders(c.n, c.m, c.j), "%d → %d, bucket %d", c.n, c.m, c.j)
		// Every stream of new bucket j was in a feeder (lemma L0).
		for h := int64(-1000); h < 1000; h += 7 {
			if eventsource.BucketOfHash(h, c.m) == c.j {
				require.Contains(t, c.want, eventsource.BucketOfHash(h, c.n))
			}
		}
	}
}

// A checkpoint reset (the operator's fence) is refused while a resize runs
// and on a retired generation's slots.
func TestCheckpointResetDuringAndAfterAResize(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupResize(t, 2)
	a := b.open(t, b.config(KindRow, 1, "a"))
	settle(t, []*Store{a}, 1)
	fence := func(slot int) error {
		return pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			_, err := FenceOut(ctx, tx, b.schema, b.sub, slot, true)
			return err
		})
	}
	require.NoError(t, fence(0))
	b.request(t, 2)
	var busy *ResizeInProgressError
	require.ErrorAs(t, fence(0), &busy)
	require.ErrorIs(t, fence(0), ErrResizeInProgress)
	settle(t, []*Store{a}, 3)
	l := a.Held()[0]
	bound, err := a.ProposeCut(ctx, l.Slot, l.Epoch, 0)
	require.NoError(t, err)
	require.True(t, bound.Decided)
	require.NoError(t, a.Drain(ctx, l.Slot, l.Epoch, bound.Limit))
	require.Equal(t, 1, b.resize(t).Generation, "1 → 2 completes with its only drain")
	require.ErrorIs(t, fence(0), ErrRetiredGeneration)
	require.NoError(t, fence(eventsource.Slot(1, 1)))
}

// Every transition of a resize notifies the subscription's lease channel
// with resize:<state>:<worker>, and wakes the workers.
func TestResizeNotifies(t *testing.T) {
	t.Parallel()
	forEachKind(t, resizeNotifies)
}

func resizeNotifies(t *testing.T, kind Kind) {
	ctx := context.Background()
	b := setupResize(t, 2)
	conn, err := pgx.ConnectConfig(ctx, b.pool.Config().ConnConfig)
	require.NoError(t, err)
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{ChannelName(b.schema, b.sub)}.Sanitize())
	require.NoError(t, err)
	next := func(prefix string) string {
		t.Helper()
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		for {
			n, err := conn.WaitForNotification(wctx)
			require.NoError(t, err, "no %s notification", prefix)
			if len(n.Payload) >= len(prefix) && n.Payload[:len(prefix)] == prefix {
				return n.Payload
			}
		}
	}
	a := b.open(t, b.config(kind, 1, "a"))
	watcher := b.open(t, b.config(kind, 1, "watcher"))
	settle(t, []*Store{a}, 1)
	drain(watcher)
	b.request(t, 2)
	require.Equal(t, "resize:sealing:test", next("resize:"))
	woken(t, watcher, "the request")
	settle(t, []*Store{a}, 2) // its old bucket and its share of the new ones (the watcher is a worker too)
	l := a.Held()[0]
	bound, err := a.ProposeCut(ctx, l.Slot, l.Epoch, 0)
	require.NoError(t, err)
	require.Equal(t, "resize:cut:a", next("resize:"))
	drain(watcher)
	require.NoError(t, a.Drain(ctx, l.Slot, l.Epoch, bound.Limit))
	require.Equal(t, "resize:steady:a", next("resize:"))
	woken(t, watcher, "the drain")
}

// A worker of an older version that creates a new subscription writes
// lease rows and no subscriptions row; this version adopts them, their
// count ruling over its own.
func TestEnsureAdoptsTheRowsOfAnOlderVersion(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setup(t)
		p1 := newProtocolOne(b.pool, b.schema, b.sub, "older", 3, 30*time.Second, nil)
		_, err := b.pool.Exec(ctx, p1.st.get("ensure_rows"), b.sub, 3)
		require.NoError(t, err)
		s := b.open(t, b.config(kind, 8, "a"))
		require.NoError(t, s.EnsureBuckets(ctx))
		gen, n := s.Serving()
		require.Equal(t, [2]int{0, 3}, [2]int{gen, n})
		require.Len(t, pass(t, s).Owned, 3)
		r, err := ReadResize(ctx, b.pool, b.schema, b.sub)
		require.NoError(t, err)
		require.Equal(t, 3, r.Buckets)
	})
}

// A slot handed over, or taken, after its holder proposed is granted on a
// row that carries the proposal: the new holding knows its bound from its
// first moment (the bound rule of docs/design/resize.md), without proposing.
func TestClaimAndRenewCarryTheBound(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 4)
		a := b.open(t, b.config(kind, 2, "a"))
		settle(t, []*Store{a}, 2)
		b.request(t, 4)
		settle(t, []*Store{a}, 6)
		b.setHead(t, 40)
		l := a.Held()[1]
		require.Equal(t, 1, l.Slot)
		bound, err := a.ProposeCut(ctx, 1, l.Epoch, 7)
		require.NoError(t, err)
		require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: 40}, bound)
		res := pass(t, a)
		require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: 40}, res.Owned[1].Bound, "the renewal carries it")
		require.Equal(t, Bound{Resize: 1}, res.Owned[0].Bound, "slot 0 has not proposed")

		// A joiner takes slot 1 by the two-phase handoff.
		bw := b.open(t, b.config(kind, 2, "b"))
		_, err = RequestHandoff(ctx, b.pool, b.schema, b.sub, 1, "b")
		require.NoError(t, err)
		res = pass(t, a)
		require.Contains(t, res.HandOff, 1)
		require.NoError(t, a.HandOver(ctx, 1))
		res = pass(t, bw)
		i := slices.IndexFunc(res.Claimed, func(l Lease) bool { return l.Slot == 1 })
		require.NotEqual(t, -1, i, "b activates its claim: %+v", res.Claimed)
		require.Equal(t, Bound{Resize: 1, Resizing: true, Limit: 40}, res.Claimed[i].Bound, "the claim carries the proposal")
		require.Equal(t, ResizeSealing, res.Resize.State)
	})
}

// During a resize each generation is shared on its own: k workers hold
// the undrained old slots and the new slots each within [floor, ceil] of
// that generation's share, and never a drained slot.
func TestFairSharePerGeneration(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 9)
		var stores []*Store
		for i := range 3 {
			stores = append(stores, b.open(t, b.config(kind, 8, fmt.Sprint("w", i))))
		}
		settle(t, stores, 8)
		b.request(t, 9)
		settle(t, stores, 17)
		cut := proposeAll(t, b, stores, 8)
		for _, i := range []int{0, 1} { // 6 old slots left undrained
			s, l := holding(t, stores, i)
			require.NoError(t, s.Drain(ctx, i, l.Epoch, cut))
		}
		within := func(active, generation int) {
			t.Helper()
			pgtest.Eventually(t, 20*time.Second, func() bool {
				round(t, stores)
				total := 0
				for _, s := range stores {
					k := 0
					for _, l := range s.Held() {
						if l.Generation == generation {
							k++
						}
						if l.Generation == 0 && l.Bucket < 2 {
							t.Fatalf("worker %s holds drained slot %d", s.Worker(), l.Slot)
						}
					}
					if k < active/3 || k > FairShare(active, 3) {
						return false
					}
					total += k
				}
				return total == active
			}, "generation %d's %d slots never shared within [floor, ceil] among 3", generation, active)
		}
		within(6, 0)
		within(9, 1)
	})
}

// A worker started during a resize with either count in its Config (a
// rolling deploy before or after the operator's change) serves the
// database's generations: the old one's undrained buckets and the new
// one's, each lease with its generation's count, without an error.
func TestAWorkerWithEitherCountDuringAResize(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 6)
		a := b.open(t, b.config(kind, 3, "a"))
		settle(t, []*Store{a}, 3)
		b.request(t, 6)
		settle(t, []*Store{a}, 9)
		cut := proposeAll(t, b, []*Store{a}, 3)
		l := a.Held()[0]
		require.NoError(t, a.Drain(ctx, l.Slot, l.Epoch, cut)) // switched: new 0 and 3 are ready
		stores := []*Store{a, b.open(t, b.config(kind, 3, "old-count")), b.open(t, b.config(kind, 6, "new-count"))}
		res := settle(t, stores, 2+6)
		for i, s := range stores {
			require.Equal(t, ResizeSwitched, res[i].Resize.State)
			gen, n := s.Serving()
			require.Equal(t, [2]int{0, 3}, [2]int{gen, n}, "worker %s", s.Worker())
			for _, l := range s.Held() {
				require.Equal(t, map[int]int{0: 3, 1: 6}[l.Generation], l.Buckets, "worker %s slot %d", s.Worker(), l.Slot)
				if l.Generation == 1 {
					require.Equal(t, l.Bucket%3 == 0, l.Ready, "worker %s new bucket %d", s.Worker(), l.Bucket)
				}
			}
		}
	})
}

// Every request takes the next id of its subscription; a proposal that
// names a resize no longer in force writes nothing and says that resize is
// over, and a drain for it is refused, whatever its cut; the generation a
// completed resize made names it, and a cancel leaves none naming it.
func TestResizeIdentity(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupResize(t, 2)
	s := b.open(t, b.config(KindRow, 1, "a"))
	settle(t, []*Store{s}, 1)
	first := b.request(t, 2)
	require.EqualValues(t, 1, first.ID)
	settle(t, []*Store{s}, 3)
	_, err := CancelResize(ctx, b.pool, b.schema, b.sub)
	require.NoError(t, err)
	made, err := ResizeMade(ctx, b.pool, b.schema, b.sub, 1)
	require.NoError(t, err)
	require.Zero(t, made, "a cancelled resize made no generation")
	second := b.request(t, 2)
	require.EqualValues(t, 2, second.ID)
	settle(t, []*Store{s}, 3)
	l := s.Held()[0]

	bound, err := s.ProposeCutFor(ctx, 0, l.Epoch, first.ID, 0)
	require.NoError(t, err)
	require.Equal(t, Bound{Resize: first.ID}, bound, "the resize proposed for is over")
	require.Equal(t, ResizeSealing, b.resize(t).State, "nothing written: the only bucket did not decide the cut")

	bound, err = s.ProposeCutFor(ctx, 0, l.Epoch, second.ID, 0)
	require.NoError(t, err)
	require.True(t, bound.Decided)
	require.Equal(t, second.ID, bound.Resize)
	stale := bound
	stale.Resize = first.ID
	require.ErrorIs(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return s.DrainCutTx(ctx, tx, 0, l.Epoch, stale) }),
		ErrNoResize, "a drain for the resize before, at the same cut")
	require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error { return s.DrainCutTx(ctx, tx, 0, l.Epoch, bound) }))
	made, err = ResizeMade(ctx, b.pool, b.schema, b.sub, 1)
	require.NoError(t, err)
	require.Equal(t, second.ID, made)
	r := b.resize(t)
	require.Equal(t, ResizeSteady, r.State)
	require.Equal(t, second.ID, r.ID, "steady, the id of the last resize")
}
