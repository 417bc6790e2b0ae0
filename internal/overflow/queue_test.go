package overflow

import (
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/kumierr"
)

// popAll drains q and returns what came out.
func popAll(q *Queue) []any {
	var out []any
	for {
		msg, ok := q.Pop()
		if !ok {
			return out
		}
		out = append(out, msg)
	}
}

func checkInvariant(t *testing.T, s Stats) {
	t.Helper()
	if s.Posted != s.Delivered+s.Dropped+uint64(s.Depth) {
		t.Fatalf("Posted %d != Delivered %d + Dropped %d + Depth %d", s.Posted, s.Delivered, s.Dropped, s.Depth)
	}
}

func TestQueue(t *testing.T) {
	t.Parallel()

	t.Run("PauseAndResumePausesDiscardsAndResumes", func(t *testing.T) {
		t.Parallel()
		var transitions []Transition
		q := newQueue(t, Config{Capacity: 4, OnTransition: func(tr Transition) { transitions = append(transitions, tr) }})
		for i := range 4 {
			if !q.Push(batch{i}) {
				t.Fatalf("batch %d refused below capacity", i)
			}
		}
		if q.Push(batch{4}) {
			t.Fatal("batch accepted by a full queue")
		}
		if q.State() != Paused || q.Depth() != 0 {
			t.Fatalf("state %v depth %d, want paused with the stale batches discarded", q.State(), q.Depth())
		}
		if q.Push(batch{5}) {
			t.Fatal("paused queue accepted a batch")
		}
		if !q.Push(other{1}) {
			t.Fatal("paused queue refused a non-batch message")
		}
		got := popAll(q)
		if len(got) != 2 || !isPaused(got[0]) || got[1] != (other{1}) {
			t.Fatalf("popped %v, want [PausedSignal other{1}]", got)
		}
		if err := q.Resume(); err != nil || q.State() != Active {
			t.Fatalf("Resume: %v, state %v", err, q.State())
		}
		if !q.Push(batch{6}) {
			t.Fatal("resumed queue refused a batch")
		}
		s := q.Stats()
		checkInvariant(t, s)
		if s.Pauses != 1 || s.Resumes != 1 || s.Dropped != 6 || s.Depth != 1 {
			t.Fatalf("stats %+v", s)
		}
		if len(transitions) != 2 || transitions[0].To != Paused || transitions[1].From != Paused || transitions[1].To != Active {
			t.Fatalf("transitions %+v", transitions)
		}
		if transitions[0].Stats.Pauses != 1 || transitions[0].Stats.State != Paused {
			t.Fatalf("transition stats %+v", transitions[0].Stats)
		}
	})

	t.Run("DropSubscriptionOverflowsForGood", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 2, Policy: DropSubscription})
		q.Push(batch{0})
		if msg, _ := q.Pop(); msg != (batch{0}) {
			t.Fatalf("popped %v", msg)
		}
		q.Push(batch{1})
		q.Push(batch{2})
		if q.Push(batch{3}) || q.State() != Overflowed {
			t.Fatalf("state %v after overflow", q.State())
		}
		got := popAll(q)
		if len(got) != 1 {
			t.Fatalf("popped %v, want only the signal", got)
		}
		sig, ok := got[0].(*OverflowedSignal)
		if !ok {
			t.Fatalf("popped %T, want *OverflowedSignal", got[0])
		}
		var oe *OverflowError
		if !errors.As(q.Err(), &oe) || oe != sig.Err || !errors.Is(sig.Err, ErrOverflowed) {
			t.Fatalf("Err %v, signal %v", q.Err(), sig.Err)
		}
		if oe.Capacity != 2 || oe.Posted != 4 || oe.Delivered != 1 || !oe.PermanentError() {
			t.Fatalf("error fields %+v", oe)
		}
		if !strings.Contains(oe.Error(), "pause_and_resume") {
			t.Fatalf("message suggests no fix: %s", oe)
		}
		if err := q.Resume(); err != sig.Err || q.State() != Overflowed {
			t.Fatalf("Resume on an overflowed queue: %v, state %v", err, q.State())
		}
		if q.Push(batch{4}) {
			t.Fatal("overflowed queue accepted a batch")
		}
		s := q.Stats()
		checkInvariant(t, s)
		if s.Overflows != 1 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("DropOldestKeepsTheNewest", func(t *testing.T) {
		t.Parallel()
		var evictions []Transition
		q := newQueue(t, Config{Capacity: 3, Policy: DropOldest, OnTransition: func(tr Transition) { evictions = append(evictions, tr) }})
		for i := range 10 {
			if !q.Push(batch{i}) {
				t.Fatalf("batch %d refused", i)
			}
		}
		got := popAll(q)
		want := []any{batch{7}, batch{8}, batch{9}}
		if !equal(got, want) {
			t.Fatalf("popped %v, want %v", got, want)
		}
		s := q.Stats()
		checkInvariant(t, s)
		if s.Evicted != 7 || s.Dropped != 7 || s.State != Active {
			t.Fatalf("stats %+v", s)
		}
		// Each eviction is reported, though no state changes: the
		// runtime's metrics count them from these reports.
		if len(evictions) != 7 {
			t.Fatalf("%d evictions reported, want 7: %+v", len(evictions), evictions)
		}
		for i, tr := range evictions {
			if !tr.Evicted || tr.From != Active || tr.To != Active || tr.Stats.Evicted != uint64(i+1) {
				t.Fatalf("eviction report %d: %+v", i, tr)
			}
		}
	})

	t.Run("DropOldestEvictsBatchesNotOtherMessages", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 1, Policy: DropOldest})
		q.Push(other{0})
		q.Push(batch{0})
		q.Push(other{1})
		q.Push(batch{1})
		want := []any{other{0}, other{1}, batch{1}}
		if got := popAll(q); !equal(got, want) {
			t.Fatalf("popped %v, want %v", got, want)
		}
	})

	t.Run("NonBatchMessagesBypassTheBound", func(t *testing.T) {
		t.Parallel()
		for _, p := range []Policy{PauseAndResume, DropSubscription, DropOldest} {
			q := newQueue(t, Config{Capacity: 1, Policy: p})
			for i := range 1000 {
				if !q.Push(other{i}) {
					t.Fatalf("%v: message %d refused", p, i)
				}
			}
			if q.Len() != 1000 || q.Depth() != 0 || q.State() != Active {
				t.Fatalf("%v: len %d depth %d state %v", p, q.Len(), q.Depth(), q.State())
			}
		}
	})

	t.Run("KeepsPostOrderAcrossKinds", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 100})
		var want []any
		for i := range 50 {
			var msg any = other{i}
			if i%3 == 0 {
				msg = batch{i}
			}
			q.Push(msg)
			want = append(want, msg)
		}
		if got := popAll(q); !equal(got, want) {
			t.Fatalf("popped %v, want %v", got, want)
		}
	})

	t.Run("HoldKeepsBatchesWhileOthersFlow", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 2})
		q.Hold()
		q.Push(batch{0})
		q.Push(other{0})
		q.Push(batch{1})
		if got := popAll(q); !equal(got, []any{other{0}}) {
			t.Fatalf("popped %v while held", got)
		}
		if s := q.Stats(); !s.Held || s.Depth != 2 {
			t.Fatalf("stats %+v", s)
		}
		q.Release()
		if got := popAll(q); !equal(got, []any{batch{0}, batch{1}}) {
			t.Fatalf("popped %v after release", got)
		}
	})

	t.Run("HeldBatchesStillOverflow", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 2})
		q.Hold()
		for i := range 3 {
			q.Push(batch{i})
		}
		if q.State() != Paused || q.Depth() != 0 {
			t.Fatalf("state %v depth %d", q.State(), q.Depth())
		}
		if got := popAll(q); len(got) != 1 || !isPaused(got[0]) {
			t.Fatalf("popped %v, want the pause signal", got)
		}
	})

	t.Run("BoundsBatchesInsideEnvelopes", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 1, Policy: DropOldest})
		q.Push(&actor.MessageEnvelope{Message: batch{0}})
		q.Push(&actor.MessageEnvelope{Message: batch{1}})
		if s := q.Stats(); s.Evicted != 1 || s.Depth != 1 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("UsesThePredicate", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 1, Policy: DropOldest, IsBatch: func(m any) bool { _, ok := m.(other); return ok }})
		q.Push(other{0})
		q.Push(other{1})
		q.Push(batch{0}) // not a batch under this predicate
		if s := q.Stats(); s.Evicted != 1 || s.Len != 2 {
			t.Fatalf("stats %+v", s)
		}
	})

	t.Run("ConcurrentPostersKeepTheBooks", func(t *testing.T) {
		t.Parallel()
		for _, p := range []Policy{PauseAndResume, DropSubscription, DropOldest} {
			q := newQueue(t, Config{Capacity: 8, Policy: p})
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					for i := range 2000 {
						q.Push(batch{g*10000 + i})
						if i%100 == 0 {
							q.Push(other{i})
						}
					}
				})
			}
			var postingDone atomic.Bool
			consumed := make(chan struct{})
			go func() { // the consumer: pops until posting ended and nothing is left
				defer close(consumed)
				for {
					finished := postingDone.Load() // read before the Pop that finds the queue empty
					msg, ok := q.Pop()
					if ok && isPaused(msg) {
						_ = q.Resume()
					}
					if !ok && finished {
						return
					}
				}
			}()
			wg.Wait()
			postingDone.Store(true)
			recv(t, consumed, "the consumer")
			s := q.Stats()
			checkInvariant(t, s)
			if s.Posted != 8000 {
				t.Fatalf("%v: stats %+v", p, s)
			}
		}
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cfg   Config
		field string
	}{
		{Config{Capacity: -1}, "overflow.Config.Capacity"},
		{Config{Policy: Policy(7)}, "overflow.Config.Policy"},
		{Config{MaxBytes: -1}, "overflow.Config.MaxBytes"},
	} {
		var ce *kumierr.ConfigError
		if _, err := New(tc.cfg); !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("New(%+v) = %v, want a *kumierr.ConfigError naming %s", tc.cfg, err, tc.field)
		}
	}
	var ce *kumierr.ConfigError
	if _, err := NewBudget(0); !errors.As(err, &ce) || ce.Field != "overflow limit" {
		t.Errorf("NewBudget(0) = %v, want a *kumierr.ConfigError naming the limit", err)
	}
	if c := (Config{}).WithDefaults(); c.Capacity != CapacityDefault || c.Policy != PauseAndResume || c.IsBatch == nil {
		t.Errorf("defaults %+v", c)
	}
}

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	for _, p := range []Policy{PauseAndResume, DropSubscription, DropOldest} {
		for _, s := range []string{p.String(), strings.ToUpper(p.String()), strings.ReplaceAll(p.String(), "_", "-")} {
			if got, err := ParsePolicy(s); err != nil || got != p {
				t.Errorf("ParsePolicy(%q) = %v, %v", s, got, err)
			}
		}
	}
	if got, err := ParsePolicy("DropOldest"); err != nil || got != DropOldest {
		t.Errorf("ParsePolicy(DropOldest) = %v, %v", got, err)
	}
	if _, err := ParsePolicy("block"); err == nil || !strings.Contains(err.Error(), "drop_oldest") {
		t.Errorf("ParsePolicy(block) = %v", err)
	}
	if Policy(9).String() != "Policy(9)" || State(9).String() != "State(9)" || Paused.String() != "paused" {
		t.Error("String of an unknown value")
	}
}

func TestRing(t *testing.T) {
	t.Parallel()
	var r ring[int]
	next, want := 0, 0
	// Interleave pushes and pops so the buffer wraps while it grows.
	for round := range 200 {
		for range round % 7 {
			r.push(next)
			next++
		}
		for range round % 5 {
			if v, ok := r.pop(); ok {
				if v != want {
					t.Fatalf("popped %d, want %d", v, want)
				}
				want++
			}
		}
	}
	for {
		v, ok := r.pop()
		if !ok {
			break
		}
		if v != want {
			t.Fatalf("popped %d, want %d", v, want)
		}
		want++
	}
	if want != next || r.len() != 0 {
		t.Fatalf("popped %d of %d, len %d", want, next, r.len())
	}
	for i := range 5000 {
		r.push(i)
	}
	if r.clear() != 5000 || r.buf != nil {
		t.Fatal("a large cleared ring kept its buffer")
	}
}

func isPaused(msg any) bool {
	_, ok := msg.(*PausedSignal)
	return ok
}

func equal(a, b []any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
