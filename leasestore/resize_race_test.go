package leasestore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// The disjointness observer of TestDisjointnessUnderContention, with
// resizes 8 → 12 → 5 in the middle of the contention: the workers'
// passes, handovers, releases, pauses past the TTL, fenced writes of stale
// beliefs and killed sessions go on while the holders propose and drain.
// No slot of any generation ever has two valid believers, and no epoch
// goes down; both resizes complete.
func TestDisjointnessUnderContentionWithResize(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setupResize(t, 12, 5)
		b.pool = pgtest.NewPool(t, 16)
		table := checkpointTable(t, b, 8)
		_, err := b.pool.Exec(ctx, "INSERT INTO "+table+" SELECT g, 0, '', 0 FROM generate_series(65536, 65536 + 11) g "+
			"UNION ALL SELECT g, 0, '', 0 FROM generate_series(131072, 131072 + 4) g")
		require.NoError(t, err)
		o := &observer{t: t, b: b, maxEpoch: map[int]int64{}}
		for i := range 8 {
			c := b.config(kind, 8, fmt.Sprintf("w%02d", i))
			c.TTL, c.Heartbeat, c.Margin, c.NoListen = 800*time.Millisecond, 300*time.Millisecond, 250*time.Millisecond, true
			o.workers = append(o.workers, &hammerWorker{s: openOn(t, b.pool, c), beliefs: map[int]belief{}})
		}
		require.NoError(t, o.workers[0].s.EnsureBuckets(ctx))
		var st hammerStats
		var proposals, drains atomic.Int64
		features := featuresOf(t, kind)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for i, w := range o.workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(i), 43))
				for o.violation.Load() == nil {
					select {
					case <-stop:
						return
					default:
					}
					if rng.IntN(4) == 0 {
						resizeStep(ctx, w, &proposals, &drains)
					} else {
						step(ctx, rng, features, w, b, table, &st)
					}
					o.check(ctx)
				}
			}()
		}
		// The operator: 8 → 12, then 12 → 5, each once the previous
		// completed. The workers stop before any assertion can fail the test.
		steadyAt := func(gen int) (Resize, bool) {
			deadline := time.Now().Add(60 * time.Second)
			for o.violation.Load() == nil && time.Now().Before(deadline) {
				r, err := ReadResize(ctx, b.pool, b.schema, b.sub)
				if err == nil && r.State == ResizeSteady && r.Generation == gen {
					return r, true
				}
				time.Sleep(20 * time.Millisecond) // polling the resize, as kumi resize follows it
			}
			r, _ := ReadResize(ctx, b.pool, b.schema, b.sub)
			return r, false
		}
		var last Resize
		reached := 0
		for gen, m := range []int{12, 5, 0} {
			r, ok := steadyAt(gen)
			last = r
			if !ok {
				break
			}
			reached = gen
			if m == 0 {
				break
			}
			if _, err := RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: m}); err != nil {
				break
			}
		}
		// The resizes can complete before any zombie write happened: the
		// workers go on contending (on the last generation) until the
		// fence has refused one, so the run always shows it at work.
		pgtest.Eventually(t, time.Minute, func() bool { return st.refused.Load() > 0 || o.violation.Load() != nil },
			"no zombie write was ever refused")
		close(stop)
		wg.Wait()
		if v := o.violation.Load(); v != nil {
			t.Fatal(*v)
		}
		require.Equal(t, 2, reached, "the resizes never completed: %+v", last)
		t.Logf("%s: %d checks; %d passes (%d failed), %d takeovers, %d handovers, %d releases, "+
			"%d fenced writes (%d refused), %d sessions killed, %d proposals, %d drains",
			kind, o.checks.Load(), st.passes.Load(), st.passErrors.Load(), st.takeovers.Load(), st.handovers.Load(),
			st.releases.Load(), st.writes.Load(), st.refused.Load(), st.kills.Load(), proposals.Load(), drains.Load())
		require.Equal(t, int64(8+12), drains.Load(), "every old slot of both resizes drained once")
		require.Positive(t, st.refused.Load(), "no zombie write was ever refused")
	})
}

// resizeStep is what a worker's readers do about a resize: a holding of a
// serving generation's slot without a bound proposes, and one bound by the
// cut drains (the reader is caught up: nothing else is delivered here).
func resizeStep(ctx context.Context, w *hammerWorker, proposals, drains *atomic.Int64) {
	gen, _ := w.s.Serving()
	for _, l := range w.s.Held() {
		if l.Generation != gen {
			continue
		}
		bound := l.Bound
		if !bound.Decided {
			var err error
			if bound, err = w.s.ProposeCut(ctx, l.Slot, l.Epoch, 0); err != nil || !bound.Resizing {
				continue
			}
			proposals.Add(1)
		}
		if bound.Decided {
			w.drop(l.Slot)
			if w.s.Drain(ctx, l.Slot, l.Epoch, bound.Limit) == nil {
				drains.Add(1)
			}
		}
	}
}
