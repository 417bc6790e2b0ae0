package overflow

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

// sized is a batch that knows its size.
type sized struct {
	n    int
	size int64
}

func (sized) OverflowBatch()         {}
func (s sized) OverflowBytes() int64 { return s.size }

func newBudget(t *testing.T, limit int64) *Budget {
	t.Helper()
	b, err := NewBudget(limit)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkBytes checks the queue's byte count against the batches it holds.
func checkBytes(t *testing.T, q *Queue, want int64) {
	t.Helper()
	s := q.Stats()
	checkInvariant(t, s)
	if s.Bytes != want {
		t.Fatalf("queue holds %d bytes, want %d (stats %+v)", s.Bytes, want, s)
	}
}

func TestQueueBytes(t *testing.T) {
	t.Parallel()

	t.Run("CountsTheBytesOfQueuedBatchesOnly", func(t *testing.T) {
		t.Parallel()
		b := newBudget(t, 1000)
		q := newQueue(t, Config{Capacity: 10, MaxBytes: 100, Budget: b})
		for i, size := range []int64{10, 20, 30} {
			if !q.Push(sized{i, size}) {
				t.Fatalf("batch %d refused under the byte bound", i)
			}
		}
		q.Push(other{1})
		q.Push(batch{9}) // not Sized: 0 bytes
		checkBytes(t, q, 60)
		if b.Used() != 60 {
			t.Fatalf("budget used %d, want 60", b.Used())
		}
		if msg, _ := q.Pop(); msg != (sized{0, 10}) {
			t.Fatalf("popped %v", msg)
		}
		checkBytes(t, q, 50)
		popAll(q)
		checkBytes(t, q, 0)
		if b.Used() != 0 {
			t.Fatalf("budget used %d after the queue drained, want 0", b.Used())
		}
	})

	t.Run("AnEmptyQueueTakesOneBatchOverItsByteBound", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 10, MaxBytes: 10})
		if !q.Push(sized{0, 50}) {
			t.Fatal("an empty queue refused a batch over its byte bound")
		}
		if q.Push(sized{1, 1}) || q.State() != Paused {
			t.Fatalf("a batch behind an oversized one was queued (state %v)", q.State())
		}
		checkBytes(t, q, 0)
	})

	t.Run("PauseAndResumePausesOnTheByteBound", func(t *testing.T) {
		t.Parallel()
		b := newBudget(t, 1000)
		q := newQueue(t, Config{Capacity: 10, MaxBytes: 100, Budget: b})
		q.Push(sized{0, 60})
		q.Push(sized{1, 30})
		if q.Push(sized{2, 20}) {
			t.Fatal("batch accepted over the byte bound")
		}
		if q.State() != Paused {
			t.Fatalf("state %v, want paused", q.State())
		}
		checkBytes(t, q, 0)
		if b.Used() != 0 {
			t.Fatalf("budget used %d after the pause discarded everything", b.Used())
		}
		if got := popAll(q); len(got) != 1 || !isPaused(got[0]) {
			t.Fatalf("popped %v, want [PausedSignal]", got)
		}
		if err := q.Resume(); err != nil || !q.Push(sized{3, 100}) {
			t.Fatalf("resumed queue refused a batch within its bound: %v", err)
		}
		checkBytes(t, q, 100)
	})

	t.Run("DropSubscriptionOverflowsOnTheByteBound", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 10, MaxBytes: 100, Policy: DropSubscription})
		q.Push(sized{0, 60})
		q.Push(sized{1, 30})
		if q.Push(sized{2, 20}) || q.State() != Overflowed {
			t.Fatalf("state %v, want overflowed", q.State())
		}
		var oe *OverflowError
		if !errors.As(q.Err(), &oe) || oe.Bound != BoundBytes || oe.Limit != 100 || oe.Bytes != 110 {
			t.Fatalf("err %#v, want a bytes overflow of 110 bytes over 100", q.Err())
		}
		if !strings.Contains(oe.Error(), "byte bound (110 bytes of 100)") {
			t.Fatalf("error %q does not say which bound", oe.Error())
		}
		checkBytes(t, q, 0)
	})

	t.Run("DropOldestEvictsUntilTheBatchFits", func(t *testing.T) {
		t.Parallel()
		q := newQueue(t, Config{Capacity: 10, MaxBytes: 100, Policy: DropOldest})
		q.Push(sized{0, 40})
		q.Push(sized{1, 30})
		q.Push(sized{2, 20})
		if !q.Push(sized{3, 80}) {
			t.Fatal("DropOldest refused a batch it could make room for")
		}
		checkBytes(t, q, 100) // 20 + 80: two evicted
		if s := q.Stats(); s.Evicted != 2 || s.State != Active {
			t.Fatalf("stats %+v, want 2 evictions", s)
		}
		if got := popAll(q); !equal(got, []any{sized{2, 20}, sized{3, 80}}) {
			t.Fatalf("popped %v", got)
		}
	})

	t.Run("TheSharedBudgetBoundsEveryQueue", func(t *testing.T) {
		t.Parallel()
		b := newBudget(t, 100)
		pause := newQueue(t, Config{Capacity: 10, Budget: b})
		evict := newQueue(t, Config{Capacity: 10, Budget: b, Policy: DropOldest})
		drop := newQueue(t, Config{Capacity: 10, Budget: b, Policy: DropSubscription})
		if !evict.Push(sized{0, 50}) || !pause.Push(sized{1, 40}) {
			t.Fatal("batches within the budget refused")
		}
		// Even an empty queue refuses a batch the budget has no room for.
		if drop.Push(sized{2, 20}) || drop.State() != Overflowed {
			t.Fatalf("state %v, want overflowed", drop.State())
		}
		var oe *OverflowError
		if !errors.As(drop.Err(), &oe) || oe.Bound != BoundBudget || oe.Limit != 100 || oe.Bytes != 110 {
			t.Fatalf("err %#v, want a budget overflow", drop.Err())
		}
		// DropOldest evicts its own batches to make room...
		if !evict.Push(sized{3, 30}) {
			t.Fatal("DropOldest refused a batch it could make room for")
		}
		checkBytes(t, evict, 30)
		if b.Used() != 70 {
			t.Fatalf("budget used %d, want 70", b.Used())
		}
		// ... and pauses when it has nothing left to evict.
		if evict.Push(sized{4, 70}) || evict.State() != Paused {
			t.Fatalf("state %v, want paused: the budget has no room for 70 more bytes", evict.State())
		}
		checkBytes(t, evict, 0)
		// PauseAndResume pauses, and gives its bytes back.
		if !pause.Push(sized{5, 60}) {
			t.Fatal("batch within the budget refused")
		}
		if pause.Push(sized{6, 1}) || pause.State() != Paused {
			t.Fatalf("state %v, want paused", pause.State())
		}
		if b.Used() != 0 {
			t.Fatalf("budget used %d with every queue empty", b.Used())
		}
	})

	t.Run("CloseGivesTheBytesBackAndDropsLaterBatches", func(t *testing.T) {
		t.Parallel()
		b := newBudget(t, 100)
		q := newQueue(t, Config{Capacity: 10, Budget: b})
		q.Push(sized{0, 40})
		q.Close()
		if b.Used() != 0 {
			t.Fatalf("budget used %d after Close", b.Used())
		}
		if q.Push(sized{1, 10}) || b.Used() != 0 {
			t.Fatal("a closed queue took a batch")
		}
		if !q.Push(other{1}) {
			t.Fatal("a closed queue refused a message that is not a batch")
		}
		if got := popAll(q); !equal(got, []any{other{1}}) || q.State() != Active {
			t.Fatalf("popped %v, state %v: Close signals nothing", got, q.State())
		}
		checkBytes(t, q, 0)
		q.Close()
	})

	t.Run("ConcurrentQueuesNeverExceedTheBudget", func(t *testing.T) {
		t.Parallel()
		const limit, queues, posts = 1000, 4, 2000
		b := newBudget(t, limit)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var over int64
		check := func() {
			if u := b.Used(); u > limit || u < 0 {
				mu.Lock()
				over = u
				mu.Unlock()
			}
		}
		qs := make([]*Queue, queues)
		for i := range qs {
			qs[i] = newQueue(t, Config{Capacity: 8, MaxBytes: 400, Budget: b, Policy: Policy(i % 3)})
			wg.Add(2)
			go func(q *Queue) { // poster
				defer wg.Done()
				for n := range posts {
					q.Push(sized{n, int64(1 + n%150)})
					check()
				}
			}(qs[i])
			go func(q *Queue) { // consumer: resumes after a pause
				defer wg.Done()
				for n := 0; n < posts; n++ {
					if msg, ok := q.Pop(); ok && isPaused(msg) {
						_ = q.Resume()
					}
					check()
				}
			}(qs[i])
		}
		wg.Wait()
		if over != 0 {
			t.Fatalf("budget used %d, over its limit %d", over, limit)
		}
		var held int64
		for _, q := range qs {
			held += q.Stats().Bytes
		}
		if b.Used() != held {
			t.Fatalf("budget used %d, queues hold %d", b.Used(), held)
		}
		for _, q := range qs {
			q.Close()
		}
		if b.Used() != 0 {
			t.Fatalf("budget used %d after every queue closed", b.Used())
		}
	})
}

func TestNewBudgetRefusesANonPositiveLimit(t *testing.T) {
	t.Parallel()
	for _, limit := range []int64{0, -1} {
		if _, err := NewBudget(limit); err == nil {
			t.Errorf("NewBudget(%d) accepted", limit)
		}
	}
}
