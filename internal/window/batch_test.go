package window

import (
	"errors"
	"slices"
	"testing"
)

func bcfg(maxEvents, maxBytes int) Config {
	c := cfg(1)
	c.Batch = Batch{MaxEvents: maxEvents, MaxBytes: maxBytes}
	return c
}

// batchOf takes events[0] into s and sends it with events[1:] pending,
// returning the send's effects.
func batchOf(t *testing.T, s *State, events []Event) Effects {
	t.Helper()
	if n, e := s.Take(events[:1]); n != 1 || !e.CheckLease {
		t.Fatalf("take: %d %+v", n, e)
	}
	return s.Lease(t0, true, events[1:])
}

// poss is the positions of events.
func poss(events []Event) []int64 {
	var out []int64
	for _, e := range events {
		out = append(out, e.Pos)
	}
	return out
}

func wantBatch(t *testing.T, e Effects, absorbed int, want ...int64) Send {
	t.Helper()
	if len(e.Sends) != 1 || !slices.Equal(poss(e.Sends[0].Events), want) || e.Absorbed != absorbed {
		t.Fatalf("sent %+v absorbing %d, want the batch %v absorbing %d", e.Sends, e.Absorbed, want, absorbed)
	}
	return e.Sends[0]
}

func wantPutBack(t *testing.T, e Effects, want ...int64) {
	t.Helper()
	if !slices.Equal(poss(e.PutBack), want) {
		t.Fatalf("put back %v, want %v", poss(e.PutBack), want)
	}
}

func TestBatchRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"ABatchTakesThePendingEventsUpToMaxEvents", func(t *testing.T) {
			s := New(bcfg(3, 0))
			wantBatch(t, batchOf(t, s, evs("a", "b", "a", "c")), 2, 1, 2, 3)
		}},
		{"ABatchStopsBeforeAnUnreadableEvent", func(t *testing.T) {
			s := New(bcfg(5, 0))
			events := evs("a", "b", "a", "c")
			events[2].Err = errors.New("unreadable")
			wantBatch(t, batchOf(t, s, events), 1, 1, 2)
		}},
		{"ABatchStopsBeforeMaxBytes", func(t *testing.T) {
			s := New(bcfg(5, 10))
			events := evs("a", "b", "a", "c")
			for i := range events {
				events[i].Size = 4
			}
			wantBatch(t, batchOf(t, s, events), 1, 1, 2)
		}},
		{"AFirstEventOverMaxBytesGoesAlone", func(t *testing.T) {
			s := New(bcfg(5, 10))
			events := evs("a", "b")
			events[0].Size = 11
			wantBatch(t, batchOf(t, s, events), 0, 1)
		}},
		{"ABatchAllAckedFinishesItsEvents", func(t *testing.T) {
			s := New(bcfg(3, 0))
			b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
			f := s.Answered(t0, Answer{ID: b.ID, Outcome: BatchAcked, Done: 3, Committed: true})
			if f.Finished != (Finished{Slots: 1, Events: 3, Through: 3, Committed: 3}) || len(f.PutBack) != 0 {
				t.Fatalf("answer: %+v", f)
			}
		}},
		{"ABatchAckedInPartFinishesItsPrefixAndItsHeadIsANewDelivery", func(t *testing.T) {
			s := New(bcfg(3, 0))
			b := wantBatch(t, batchOf(t, s, evs("a", "b", "a", "c")), 2, 1, 2, 3)
			f := s.Answered(t0, Answer{ID: b.ID, Outcome: BatchAcked, Done: 1, Next: Retry, Committed: true})
			if f.Finished != (Finished{Events: 1, Through: 1, Committed: 1}) {
				t.Fatalf("finished %+v", f.Finished)
			}
			wantPutBack(t, f, 3)
			if len(f.Redeliver) != 1 || f.Redeliver[0].ID == b.ID || f.Redeliver[0].Attempt != 1 {
				t.Fatalf("the head's retry: %+v (the batch was #%d)", f.Redeliver, b.ID)
			}
			r := s.Redeliver(at(20), f.Redeliver[0].ID, 1)
			if !r.CheckLease {
				t.Fatalf("redeliver: %+v", r)
			}
			h := wantBatch(t, s.Lease(at(20), true, evs("x", "x", "a", "c")[2:]), 2, 2, 3, 4)
			if h.Attempt != 1 || h.Free != 0 {
				t.Fatalf("the head is sent as %+v", h)
			}
		}},
		{"TheHeadOfABatchAckedInPartTakesItsAnswer", func(t *testing.T) {
			s := New(bcfg(3, 0))
			b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
			f := s.Answered(t0, Answer{ID: b.ID, Outcome: BatchAcked, Done: 1, Next: DeadLettered, Reason: "no"})
			if len(f.Letters) != 1 || f.Letters[0].Pos != 2 || f.Letters[0].Attempts != 1 || f.Letters[0].Budget {
				t.Fatalf("the head's letter: %+v", f.Letters)
			}
			wantPutBack(t, f, 3)
			if w := s.LetterWritten(f.Letters[0].ID); w.Finished != (Finished{Slots: 1, Events: 1, Through: 2}) {
				t.Fatalf("written: %+v", w.Finished)
			}
		}},
		{"ABatchFailedAsAWholeSendsItsFirstEventAlone", func(t *testing.T) {
			for _, o := range []Outcome{Retry, Panicked, Acked, DeadLettered} {
				s := New(bcfg(3, 0))
				b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
				f := s.Answered(t0, Answer{ID: b.ID, Outcome: o})
				wantPutBack(t, f, 2, 3)
				if len(f.Redeliver) != 1 || f.Redeliver[0].ID != b.ID || f.Finished.Events != 0 {
					t.Fatalf("%v: %+v", o, f)
				}
				s.Redeliver(at(20), b.ID, 1)
				a := wantBatch(t, s.Lease(at(20), true, evs("a", "b", "a")[1:]), 0, 1)
				if a.Attempt != 1 {
					t.Fatalf("%v: sent alone as %+v", o, a)
				}
				// Alone until the slot finishes: its next slot is a batch.
				if f := s.Answered(at(20), Answer{ID: a.ID, Attempt: 1, Outcome: BatchAcked, Done: 1}); f.Finished.Events != 1 {
					t.Fatalf("%v: the event alone acked: %+v", o, f)
				}
				wantBatch(t, batchOf(t, s, evs("a", "b", "a")[1:]), 1, 2, 3)
			}
		}},
		{"ABatchAckOutsideTheBatchFailsItAsAWhole", func(t *testing.T) {
			for _, done := range []int{-1, 4} {
				s := New(bcfg(3, 0))
				b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
				f := s.Answered(t0, Answer{ID: b.ID, Outcome: BatchAcked, Done: done})
				wantPutBack(t, f, 2, 3)
				s.Redeliver(at(20), b.ID, 1)
				wantBatch(t, s.Lease(at(20), true, evs("a", "b", "a")[1:]), 0, 1)
			}
		}},
		{"ABatchUnansweredInTimeFailsAsAWhole", func(t *testing.T) {
			s := New(bcfg(3, 0))
			b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
			f := s.Tick(at(100))
			wantPutBack(t, f, 2, 3)
			if len(f.GivenUp) != 1 || !f.GivenUp[0].Late || len(f.Redeliver) != 1 {
				t.Fatalf("tick: %+v", f)
			}
			s.ProbeAnswered(f.Probe)
			s.Redeliver(at(200), b.ID, 1)
			wantBatch(t, s.Lease(at(200), true, evs("a", "b", "a")[1:]), 0, 1)
		}},
		{"ABatchOfAReplacedHandlerGoesWholeToItsSuccessorUncharged", func(t *testing.T) {
			s := New(bcfg(3, 0))
			b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
			f := s.HandlerStopped(at(10), 1)
			wantPutBack(t, f, 2, 3)
			s.HandlerSpawned()
			n := wantBatch(t, s.Lease(at(10), true, evs("a", "b", "a")[1:]), 2, 1, 2, 3)
			if n.ID != b.ID || n.Attempt != 1 || n.Free != 1 {
				t.Fatalf("sent to the successor as %+v", n)
			}
		}},
		{"ABatchFailedAsAWholeIsChargedToNoEvent", func(t *testing.T) {
			// With MaxAttempts 1, the first event is retried alone, not
			// dead-lettered: the batch's failure says nothing of which
			// event broke it; alone, its own failure is charged.
			c := bcfg(3, 0)
			c.MaxAttempts = 1
			s := New(c)
			b := wantBatch(t, batchOf(t, s, evs("a", "b", "a")), 2, 1, 2, 3)
			f := s.Answered(t0, Answer{ID: b.ID, Outcome: Panicked})
			if len(f.Letters) != 0 || len(f.Redeliver) != 1 {
				t.Fatalf("answer: %+v", f)
			}
			wantPutBack(t, f, 2, 3)
			f = s.Redeliver(f.Redeliver[0].At, f.Redeliver[0].ID, f.Redeliver[0].Attempt)
			if !f.CheckLease {
				t.Fatalf("redeliver: %+v", f)
			}
			alone := wantBatch(t, s.Lease(t0, true, evs("a", "b", "a")[1:]), 0, 1)
			f = s.Answered(t0, Answer{ID: alone.ID, Attempt: alone.Attempt, Outcome: Panicked})
			if len(f.Letters) != 1 || f.Letters[0].Pos != 1 || !f.Letters[0].Budget {
				t.Fatalf("alone: %+v", f)
			}
		}},
	} {
		t.Run(tc.name, tc.run)
	}
}
