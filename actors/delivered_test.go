package actors

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// Waits that end on a stall, not on a deadline. On a loaded machine (the
// CI's two cores running two packages' tests at once) a group drains its
// backlog after a resize slowly — every handler commits through its own
// transaction, every pass renews a dozen leases — and a fixed deadline
// takes the slowness for a fault. These waits fail when the work stops
// moving instead: when the measure of progress has not grown for stall,
// or after a generous cap in all. A real stall — an event never
// delivered — still fails, with what was missing and where it stood.
const (
	// stallFor is how long the progress measure may stand still before a
	// wait fails: ten lease TTLs of resizeLease, and many passes.
	stallFor = waitLong
	// progressCap bounds a wait that keeps progressing.
	progressCap = 5 * waitLong
)

// progressSample is the progress measure at one time of a wait.
type progressSample struct {
	at time.Duration // since the wait began
	n  int
}

// eventuallyProgressing polls cond until it holds. It fails the test with
// msg and describe's diagnosis when progress — a measure that changes
// while the system works towards cond — has not changed for stall, or
// once limit has passed; the failure says how the measure moved. A
// standstill of a quarter of stall that then moves on is logged with
// describe's diagnosis as it stood (go test prints it with -v, or with
// the test's failure): a stall that recovered — a lease that had to
// expire first — shows there.
func eventuallyProgressing(t testing.TB, stall, limit time.Duration, cond func() bool, progress func() int,
	describe func() string, msg string, args ...any) {
	t.Helper()
	start := time.Now()
	last, lastAt := progress(), start
	history := []progressSample{{0, last}}
	var longest time.Duration
	described := false
	for {
		if pgtest.WaitFor(time.Second, cond) {
			if longest >= stall/4 {
				t.Logf("%s: met after %v; the longest standstill %v; progress (since the wait began → measure): %v",
					fmt.Sprintf(msg, args...), time.Since(start).Round(time.Millisecond), longest.Round(time.Millisecond), tail(history))
			}
			return
		}
		now := time.Now()
		if n := progress(); n != last {
			longest = max(longest, now.Sub(lastAt))
			last, lastAt, described = n, now, false
			history = append(history, progressSample{now.Sub(start).Round(time.Millisecond), n})
		}
		still := now.Sub(lastAt)
		if still >= stall || now.Sub(start) >= limit {
			why := fmt.Sprintf("no progress for %v", still.Round(time.Millisecond))
			if still < stall {
				why = fmt.Sprintf("still progressing after %v (the last %v ago)", limit, still.Round(time.Millisecond))
			}
			t.Fatalf("pgtest: condition not met, %s: %s\nprogress (since the wait began → measure): %v%s",
				why, fmt.Sprintf(msg, args...), tail(history), describe())
		}
		if still >= stall/4 && !described {
			described = true
			t.Logf("%s: no progress for %v, waiting on; as it stands:%s", fmt.Sprintf(msg, args...),
				still.Round(time.Millisecond), describe())
		}
	}
}

// tail is the last samples of a wait's history.
func tail(h []progressSample) []progressSample {
	return h[max(len(h)-12, 0):]
}

// changes counts the changes of what f returns, each time it is called: a
// progress measure for eventuallyProgressing from a description of state.
func changes(f func() string) func() int {
	last, n := f(), 0
	return func() int {
		if v := f(); v != last {
			last, n = v, n+1
		}
		return n
	}
}

// waitDelivered waits until rec has seen every one of the total events of
// category, as long as their deliveries progress (eventuallyProgressing).
// Its failure says which events are missing — each with its slot in every
// generation of sizes (the bucket counts, generation 0 first), that slot's
// checkpoint and lease — the resize, and each worker's readers (cursor,
// acked, pending, in flight, their resize part).
func waitDelivered(t testing.TB, store *eventsource.Store, sub, category string, rec *recorder, total int,
	sizes []int, ws ...*testWorker) {
	t.Helper()
	eventuallyProgressing(t, stallFor, progressCap, func() bool { return rec.distinct() == total }, rec.distinct,
		func() string { return deliveryDiagnosis(store, sub, category, rec, sizes, ws) },
		"every event delivered (%d of %d)", observed(rec.distinct), total)
}

// deliveryDiagnosis describes the events of category rec has not seen and
// where they stand (see waitDelivered).
func deliveryDiagnosis(store *eventsource.Store, sub, category string, rec *recorder, sizes []int, ws []*testWorker) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	var all []eventsource.RecordedEvent
	for after := int64(0); ; {
		page, err := store.ReadCategory(ctx, category, after, 1000)
		if err != nil {
			fmt.Fprintf(&b, "\nread the category: %v", err)
			break
		}
		if len(page) == 0 {
			break
		}
		all = append(all, page...)
		after = page[len(page)-1].Position
	}
	rec.mu.Lock()
	var missing []eventsource.RecordedEvent
	for _, e := range all {
		if rec.count[e.ID] == 0 {
			missing = append(missing, e)
		}
	}
	rec.mu.Unlock()
	cps := map[int]int64{}
	if l, err := store.Checkpoints(ctx, sub); err != nil {
		fmt.Fprintf(&b, "\ncheckpoints: %v", err)
	} else {
		for _, c := range l {
			cps[c.Bucket] = c.Position
		}
	}
	fmt.Fprintf(&b, "\n%d of the %d events of %s in the store not delivered", len(missing), len(all), category)
	bySlot := map[int][]int64{}
	for i, e := range missing {
		var where []string
		for g, n := range sizes {
			s := eventsource.Slot(g, e.Bucket(n))
			bySlot[s] = append(bySlot[s], e.Position)
			cp, ok := cps[s]
			where = append(where, fmt.Sprintf("gen %d slot %d (checkpoint %d, %v)", g, s, cp, ok))
		}
		if i < 20 {
			fmt.Fprintf(&b, "\n  position %d %s v%d: %s", e.Position, e.Stream, e.Version, strings.Join(where, "; "))
		}
	}
	slots := make([]int, 0, len(bySlot))
	for s := range bySlot {
		slots = append(slots, s)
	}
	sort.Ints(slots)
	for _, s := range slots {
		p := bySlot[s]
		fmt.Fprintf(&b, "\n  slot %d: %d missing, positions %d…%d, checkpoint %d", s, len(p), p[0], p[len(p)-1], cps[s])
	}
	if r, err := leasestore.ReadResize(ctx, store.Pool(), store.Schema(), sub); err != nil {
		fmt.Fprintf(&b, "\nresize: %v", err)
	} else {
		fmt.Fprintf(&b, "\nresize: %+v", r)
	}
	for i, w := range ws {
		if i == 0 {
			b.WriteString(w.diagnose()) // with the store's rows
			continue
		}
		b.WriteString(w.diagnoseProcess())
	}
	return b.String()
}

// waitResize waits until cond holds of the subscription's resize, as long
// as the resize or the deliveries progress (eventuallyProgressing; see
// resizeProgress). Its failure describes the resize and the workers ws.
func waitResize(t testing.TB, store *eventsource.Store, sub string, rec *recorder, cond func(leasestore.Resize) bool,
	ws []*testWorker, msg string, args ...any) {
	t.Helper()
	var r leasestore.Resize
	var err error
	eventuallyProgressing(t, stallFor, progressCap, func() bool {
		r, err = leasestore.ReadResize(context.Background(), store.Pool(), store.Schema(), sub)
		return err == nil && cond(r)
	}, changes(func() string { return fmt.Sprintf("%s delivered %d", resizeProgress(store, sub), rec.distinct()) }),
		func() string {
			var b strings.Builder
			fmt.Fprintf(&b, "\nresize now: %+v (%v)", r, err)
			for i, w := range ws {
				if i == 0 {
					b.WriteString(w.diagnose())
				} else {
					b.WriteString(w.diagnoseProcess())
				}
			}
			return b.String()
		}, msg, args...)
}
