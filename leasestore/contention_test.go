package leasestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// belief is what a worker acts on: it holds bucket at epoch until expires
// (the database's expiry), through the session with backend pid (a kind
// with session evidence).
type belief struct {
	epoch   int64
	expires time.Time
	pid     int32
}

// hammerWorker plays one worker: it drops a belief before it gives the
// bucket up, and records one only after the database granted it.
type hammerWorker struct {
	s       *Store
	mu      sync.Mutex
	beliefs map[int]belief
}

func (w *hammerWorker) snapshot() map[int]belief {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make(map[int]belief, len(w.beliefs))
	for b, v := range w.beliefs {
		out[b] = v
	}
	return out
}

func (w *hammerWorker) drop(buckets ...int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range buckets {
		delete(w.beliefs, b)
	}
}

func (w *hammerWorker) believe(owned []Lease) {
	var pid int32
	if w.s.session != nil {
		pid = w.s.session.backendPID()
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.beliefs = map[int]belief{}
	for _, l := range owned {
		w.beliefs[l.Slot] = belief{epoch: l.Epoch, expires: l.Expires, pid: pid}
	}
}

// observer checks the invariants after every step of every worker.
type observer struct {
	t         *testing.T
	b         *testBundle
	workers   []*hammerWorker
	mu        sync.Mutex
	maxEpoch  map[int]int64
	checks    atomic.Int64
	violation atomic.Pointer[string]
}

func (o *observer) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	o.violation.CompareAndSwap(nil, &msg)
}

// check: no bucket has two holders whose leases are both valid, and no
// epoch ever goes down. Beliefs are read BEFORE the database, so a belief
// judged valid was held at a time no later than the database's now().
func (o *observer) check(ctx context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	beliefs := make([]map[int]belief, len(o.workers))
	for i, w := range o.workers {
		beliefs[i] = w.snapshot()
	}
	var now time.Time
	var slots []int32
	var epochs []int64
	var lockPIDs []int32
	err := o.b.pool.QueryRow(ctx, `SELECT now(),
		(SELECT array_agg(bucket ORDER BY bucket) FROM `+pgx.Identifier{o.b.schema, "lease_buckets"}.Sanitize()+`),
		(SELECT array_agg(epoch ORDER BY bucket) FROM `+pgx.Identifier{o.b.schema, "lease_buckets"}.Sanitize()+`),
		(SELECT coalesce(array_agg(pid), '{}') FROM pg_locks WHERE locktype = 'advisory' AND granted)`).
		Scan(&now, &slots, &epochs, &lockPIDs)
	if err != nil {
		if ctx.Err() == nil {
			o.fail("observer query: %v", err)
		}
		return
	}
	sessions := map[int32]bool{}
	for _, p := range lockPIDs {
		sessions[p] = true
	}
	holders := map[int][]string{}
	for i, bs := range beliefs {
		for b, v := range bs {
			if v.expires.After(now) && (v.pid == 0 || sessions[v.pid]) {
				holders[b] = append(holders[b], fmt.Sprintf("%s@%d", o.workers[i].s.Worker(), v.epoch))
			}
		}
	}
	for b, hs := range holders {
		if len(hs) > 1 {
			o.fail("bucket %d has two valid holders at %v: %v", b, now, hs)
		}
	}
	present := map[int]bool{}
	for i, e := range epochs {
		b := int(slots[i])
		present[b] = true
		if e < o.maxEpoch[b] {
			o.fail("bucket %d epoch went down: %d after %d", b, e, o.maxEpoch[b])
		}
		o.maxEpoch[b] = e
	}
	for b := range o.maxEpoch {
		if !present[b] {
			delete(o.maxEpoch, b) // a retired generation's row, deleted by a resize
		}
	}
	o.checks.Add(1)
}

type hammerStats struct {
	passes, passErrors, handovers, releases, takeovers, writes, refused, kills atomic.Int64
}

func hammer(t *testing.T, kind Kind, workers, n int, run time.Duration) {
	b := setup(t)
	b.pool = pgtest.NewPool(t, int32(workers+4))
	ctx := context.Background()
	table := checkpointTable(t, b, n)
	o := &observer{t: t, b: b, maxEpoch: map[int]int64{}}
	for i := range workers {
		c := b.config(kind, n, fmt.Sprintf("w%02d", i))
		c.TTL, c.Heartbeat, c.Margin, c.NoListen = 800*time.Millisecond, 300*time.Millisecond, 250*time.Millisecond, true
		o.workers = append(o.workers, &hammerWorker{s: openOn(t, b.pool, c), beliefs: map[int]belief{}})
	}
	var st hammerStats
	features := featuresOf(t, kind)
	stop := make(chan struct{})
	start := time.Now()
	var wg sync.WaitGroup
	for i, w := range o.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 42))
			for o.violation.Load() == nil {
				select {
				case <-stop:
					return
				default:
				}
				step(ctx, rng, features, w, b, table, &st)
				o.check(ctx)
			}
		}()
	}
	// The workers contend for run, then on until each kind of event the
	// run must show has happened: on a loaded machine most passes of a
	// 300 ms heartbeat are abandoned, and a run of fixed length could end
	// with no handover (CI: 78 passes, 53 of them abandoned, in 4 s). They
	// stop before any assertion can fail the test.
	pgtest.WaitFor(run+2*time.Minute, func() bool {
		shown := st.takeovers.Load() > 0 && st.handovers.Load() > 0 && st.refused.Load() > 0
		return (shown && time.Since(start) >= run) || o.violation.Load() != nil
	})
	close(stop)
	wg.Wait()
	if v := o.violation.Load(); v != nil {
		t.Fatal(*v)
	}
	t.Logf("%s: %d checks; %d passes (%d failed), %d takeovers, %d handovers, %d releases, "+
		"%d fenced writes (%d refused), %d sessions killed",
		kind, o.checks.Load(), st.passes.Load(), st.passErrors.Load(), st.takeovers.Load(), st.handovers.Load(),
		st.releases.Load(), st.writes.Load(), st.refused.Load(), st.kills.Load())
	require.Positive(t, st.takeovers.Load(), "no bucket was ever taken from a lapsed owner")
	require.Positive(t, st.handovers.Load(), "no bucket was ever handed over")
	require.Positive(t, st.refused.Load(), "no zombie write was ever refused")
}

// step is one random action of a worker.
func step(ctx context.Context, rng *rand.Rand, features kindFeatures, w *hammerWorker, b *testBundle, table string, st *hammerStats) {
	switch r := rng.IntN(100); {
	case r < 50: // a reconcile pass; drain and hand over most handoffs at once
		res, err := w.s.Pass(ctx)
		st.passes.Add(1)
		if err != nil {
			st.passErrors.Add(1)
			return
		}
		w.believe(res.Owned)
		st.takeovers.Add(int64(len(res.Takeovers)))
		for _, bk := range res.HandOff {
			if rng.IntN(10) < 7 {
				w.drop(bk)
				if w.s.HandOver(ctx, bk) == nil {
					st.handovers.Add(1)
				}
			}
		}
	case r < 60: // release some
		var some []int
		for bk := range w.snapshot() {
			if rng.IntN(3) == 0 {
				some = append(some, bk)
			}
		}
		w.drop(some...)
		if w.s.Release(ctx, some) == nil {
			st.releases.Add(int64(len(some)))
		}
	case r < 80: // fenced writes for everything it believes it holds, valid or not
		for bk, v := range w.snapshot() {
			err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				if err := w.s.Fence(bk, v.epoch).Check(ctx, tx); err != nil {
					return err
				}
				var landed bool
				err := tx.QueryRow(ctx, "UPDATE "+table+" SET epoch = $2, writer = $3 WHERE bucket = $1 AND epoch <= $2 "+
					"RETURNING true", bk, v.epoch, w.s.Worker()).Scan(&landed)
				if errors.Is(err, pgx.ErrNoRows) {
					return fmt.Errorf("bucket %d: the fence let epoch %d write after a newer epoch", bk, v.epoch)
				}
				return err
			})
			st.writes.Add(1)
			switch {
			case errors.Is(err, eventsource.ErrFenceLost):
				st.refused.Add(1)
			case err != nil && ctx.Err() == nil:
				panic(err) // a fence that let a stale write through, or a broken test
			}
		}
	case r < 85: // a pause longer than the TTL: it wakes up a zombie
		time.Sleep(time.Duration(850+rng.IntN(200)) * time.Millisecond)
	case r < 88 && features.sessionEvidence: // its session dies under it
		if pid := w.s.session.backendPID(); pid != 0 {
			_, _ = b.pool.Exec(ctx, "SELECT pg_terminate_backend($1, 2000)", pid)
			st.kills.Add(1)
		}
	default: // a short pause
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond)
	}
}

func TestDisjointnessUnderContention(t *testing.T) {
	t.Parallel()
	t.Run("NoBucketEverHasTwoValidHoldersAndEpochsOnlyGrow", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			hammer(t, kind, 16, 64, 4*time.Second)
		})
	})
}
