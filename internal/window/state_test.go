package window

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Unix(0, 0)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func cfg(inFlight int) Config {
	return Config{MaxInFlight: inFlight, MaxAttempts: 3, Timeout: 100 * time.Millisecond, ProbeWait: 50 * time.Millisecond,
		Backoff: func(n int) time.Duration { return time.Duration(n) * 10 * time.Millisecond }}
}

func evs(streams ...string) []Event {
	var out []Event
	for i, s := range streams {
		out = append(out, Event{Pos: int64(i + 1), Stream: s})
	}
	return out
}

// sends returns the positions and attempts sent.
func sends(e Effects) [][2]int {
	var out [][2]int
	for _, s := range e.Sends {
		out = append(out, [2]int{int(s.Pos), s.Attempt})
	}
	return out
}

func wantSends(t *testing.T, e Effects, want ...[2]int) {
	t.Helper()
	got := sends(e)
	if len(got) != len(want) {
		t.Fatalf("sent %v, want %v", got, want)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("sent %v, want %v", got, want)
		}
	}
}

// take takes events and answers the lease check held, returning its
// effects.
func take(t *testing.T, s *State, events []Event) Effects {
	t.Helper()
	_, e := s.Take(events)
	if !e.CheckLease {
		t.Fatalf("no lease check asked for %v", events)
	}
	if len(e.Sends) != 0 {
		t.Fatalf("sent before the lease check: %+v", e.Sends)
	}
	return s.Lease(t0, true, nil)
}

func id(e Effects, pos int64) (uint64, int) {
	for _, s := range e.Sends {
		if s.Pos == pos {
			return s.ID, s.Attempt
		}
	}
	panic("not sent")
}

func TestRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"AtMostMaxInFlightSlotsAreTaken", func(t *testing.T) {
			s := New(cfg(2))
			if n, _ := s.Take(evs("a", "b", "c")); n != 2 || s.Room() != 0 {
				t.Fatalf("took %d, room %d", n, s.Room())
			}
		}},
		{"AStreamWaitsForItsEarlierEventOthersDoNot", func(t *testing.T) {
			s := New(cfg(3))
			e := take(t, s, evs("a", "a", "b"))
			wantSends(t, e, [2]int{1, 0}, [2]int{3, 0})
			i, a := id(e, 1)
			wantSends(t, s.Answered(t0, Answer{ID: i, Attempt: a}))
			wantSends(t, s.Lease(t0, true, nil), [2]int{2, 0})
		}},
		{"MaxInFlightOneDeliversOneAtATime", func(t *testing.T) {
			s := New(cfg(1))
			e := take(t, s, evs("a", "b"))
			wantSends(t, e, [2]int{1, 0})
			i, a := id(e, 1)
			f := s.Answered(t0, Answer{ID: i, Attempt: a})
			if f.Finished.Slots != 1 || f.Finished.Through != 1 || s.Room() != 1 {
				t.Fatalf("finished %+v, room %d", f.Finished, s.Room())
			}
			wantSends(t, take(t, s, evs("a", "b")[1:]), [2]int{2, 0})
		}},
		{"AnUnsureLeaseSendsNothingAndDrains", func(t *testing.T) {
			s := New(cfg(2))
			s.Take(evs("a"))
			e := s.Lease(t0, false, nil)
			if len(e.Sends) != 0 || !e.Drained || s.Room() != 0 {
				t.Fatalf("unsure: %+v, room %d", e, s.Room())
			}
		}},
		{"ALeaseFoundUnsureElsewhereSendsNothingMore", func(t *testing.T) {
			s := New(cfg(2))
			i, _ := id(take(t, s, evs("a", "b")[:1]), 1)
			s.Answered(t0, Answer{ID: i, Outcome: Retry})
			if e := s.Unsure(); !e.Drained || e.CheckLease {
				t.Fatalf("unsure: %+v", e)
			}
			if n, e := s.Take(evs("a", "b")[1:]); n != 0 || e.CheckLease {
				t.Fatalf("took %d: %+v", n, e)
			}
		}},
		{"ALeaseAnswerNotAskedForSendsNothing", func(t *testing.T) {
			s := New(cfg(2))
			take(t, s, evs("a"))
			wantSends(t, s.Lease(t0, true, nil))
		}},
		{"AStaleAnswerChangesNothing", func(t *testing.T) {
			s := New(cfg(1))
			i, _ := id(take(t, s, evs("a")), 1)
			before := s.String()
			for _, a := range []Answer{{ID: i, Attempt: 1}, {ID: i + 7}} {
				if e := s.Answered(t0, a); e.Finished.Slots != 0 || s.String() != before {
					t.Fatalf("stale %+v: %+v, %s", a, e, s)
				}
			}
		}},
		{"ARetryWaitsItsDelayAndIsSentAfterALeaseCheck", func(t *testing.T) {
			s := New(cfg(1))
			i, _ := id(take(t, s, evs("a")), 1)
			e := s.Answered(at(5), Answer{ID: i, Attempt: 0, Outcome: Retry, After: 3 * time.Millisecond})
			if len(e.Redeliver) != 1 || e.Redeliver[0] != (Redelivery{ID: i, Attempt: 1, At: at(15)}) {
				t.Fatalf("redelivery %+v (the backoff's 10ms beats the 3ms asked)", e.Redeliver)
			}
			if e := s.Redeliver(at(15), i, 0); e.CheckLease {
				t.Fatalf("a redelivery of another attempt acted: %+v", e)
			}
			r := s.Redeliver(at(15), i, 1)
			if !r.CheckLease || len(r.Sends) != 0 {
				t.Fatalf("a retry is sent without a lease check: %+v", r)
			}
			wantSends(t, s.Lease(at(15), true, nil), [2]int{1, 1})
		}},
		{"ASpentBudgetDeadLetters", func(t *testing.T) {
			s := New(cfg(1))
			i, _ := id(take(t, s, evs("a")), 1)
			for a := range 2 {
				s.Answered(t0, Answer{ID: i, Attempt: a, Outcome: Panicked})
				s.Redeliver(t0, i, a+1)
				wantSends(t, s.Lease(t0, true, nil), [2]int{1, a + 1})
			}
			e := s.Answered(t0, Answer{ID: i, Attempt: 2, Outcome: Retry})
			if len(e.Letters) != 1 || !e.Letters[0].Budget || e.Letters[0].Attempts != 3 {
				t.Fatalf("letters %+v", e.Letters)
			}
			if f := s.LetterWritten(i); f.Finished.Slots != 1 {
				t.Fatalf("written: %+v", f)
			}
		}},
		{"AHandlersDeadLetterCountsTheAttempt", func(t *testing.T) {
			s := New(cfg(1))
			i, _ := id(take(t, s, evs("a")), 1)
			e := s.Answered(t0, Answer{ID: i, Outcome: DeadLettered, Reason: "bad"})
			if len(e.Letters) != 1 || e.Letters[0].Budget || e.Letters[0].Attempts != 1 || e.Letters[0].Reason != "bad" {
				t.Fatalf("letters %+v", e.Letters)
			}
		}},
		{"AnUnreadableEventIsDeadLetteredNotSent", func(t *testing.T) {
			s := New(cfg(2))
			ev := evs("a", "b")
			ev[0].Err = errors.New("cannot decode")
			e := take(t, s, ev)
			wantSends(t, e, [2]int{2, 0})
			if len(e.Letters) != 1 || e.Letters[0].Pos != 1 || e.Letters[0].Attempts != 0 || e.Letters[0].Reason != "cannot decode" {
				t.Fatalf("letters %+v", e.Letters)
			}
		}},
		{"AFailedLetterIsWrittenAgainBeforeItsSlotFinishes", func(t *testing.T) {
			s := New(cfg(1))
			ev := evs("a")
			ev[0].Err = errors.New("x")
			i := take(t, s, ev).Letters[0].ID
			if e := s.LetterFailed(i); e.Finished.Slots != 0 {
				t.Fatalf("a failed letter finished its slot")
			}
			if e := s.LetterWritten(i); e.Finished.Slots != 0 {
				t.Fatalf("a failed letter is written without being written again")
			}
			if e := s.RewriteLetter(i); len(e.Letters) != 1 {
				t.Fatalf("rewrite: %+v", e)
			}
			if e := s.LetterWritten(i); e.Finished.Slots != 1 {
				t.Fatalf("written: %+v", e)
			}
		}},
		{"TheFinishedPrefixStopsAtAnUnfinishedSlot", func(t *testing.T) {
			s := New(cfg(3))
			e := take(t, s, evs("a", "b", "c"))
			i2, _ := id(e, 2)
			i3, _ := id(e, 3)
			i1, _ := id(e, 1)
			if f := s.Answered(t0, Answer{ID: i2}); f.Finished.Slots != 0 {
				t.Fatalf("finished %+v past event 1", f.Finished)
			}
			s.Answered(t0, Answer{ID: i3, Committed: true})
			if f := s.Answered(t0, Answer{ID: i1}); f.Finished != (Finished{Slots: 3, Events: 3, Through: 3}) {
				t.Fatalf("finished %+v", f.Finished)
			}
		}},
		{"ALateDeliveryIsRetriedAndTheHandlerProbedNothingSentMeanwhile", func(t *testing.T) {
			s := New(cfg(2))
			i, _ := id(take(t, s, evs("a", "a")), 1)
			e := s.Tick(at(100))
			if e.Probe == 0 || len(e.Redeliver) != 1 || e.Replace != nil || len(e.GivenUp) != 1 ||
				e.GivenUp[0] != (GivenUp{ID: i, Attempt: 0, Late: true}) {
				t.Fatalf("tick: %+v", e)
			}
			if r := s.Redeliver(at(200), i, 1); r.CheckLease {
				t.Fatalf("a lease check asked while the probe is out: %+v", r)
			}
			if r := s.ProbeAnswered(e.Probe); !r.CheckLease {
				t.Fatalf("the probe's answer sends nothing: %+v", r)
			}
			wantSends(t, s.Lease(at(200), true, nil), [2]int{1, 1})
		}},
		{"AnUnansweredProbeReplacesTheHandlerAndItsDeliveriesGoFree", func(t *testing.T) {
			s := New(cfg(2))
			e := take(t, s, evs("a", "b"))
			i1, _ := id(e, 1)
			s.Answered(t0, Answer{ID: i1, Outcome: Retry}) // event 1 retries
			s.Redeliver(at(10), i1, 1)
			wantSends(t, s.Lease(at(60), true, nil), [2]int{1, 1}) // sent at 60: not late at 100
			p := s.Tick(at(100)).Probe                             // event 2 is late
			if p == 0 {
				t.Fatal("no probe")
			}
			r := s.Tick(at(150))
			if r.Replace == nil || r.Replace.Old != 1 || r.Replace.Fails != 1 || r.Replace.Hung == nil ||
				r.Replace.Hung.Pos != 2 || !r.Replace.SentAt.Equal(t0) {
				t.Fatalf("not replaced: %+v", r)
			}
			if len(r.GivenUp) != 1 || r.GivenUp[0] != (GivenUp{ID: i1, Attempt: 1}) {
				t.Fatalf("given up: %+v (event 1 goes to the successor)", r.GivenUp)
			}
			if h := s.HandlerStopped(at(150), 1); h.Replace != nil {
				t.Fatal("the replaced handler's stop replaced its successor")
			}
			sp := s.HandlerSpawned()
			if !sp.CheckLease {
				t.Fatal("the successor gets nothing")
			}
			l := s.Lease(at(150), true, nil)
			wantSends(t, l, [2]int{1, 2})
			if l.Sends[0].Free != 1 || l.Sends[0].Handler != 2 {
				t.Fatalf("sends %+v: event 1 goes free to the successor", l.Sends)
			}
			i2, _ := id(e, 2)
			s.Redeliver(at(150), i2, 1) // event 2 was charged its timeout: a retry
			l = s.Lease(at(150), true, nil)
			wantSends(t, l, [2]int{2, 1})
			if l.Sends[0].Free != 0 {
				t.Fatalf("sends %+v: event 2's timeout was its own", l.Sends)
			}
		}},
		{"AStoppedHandlerIsReplaced", func(t *testing.T) {
			s := New(cfg(1))
			take(t, s, evs("a"))
			if e := s.HandlerStopped(at(10), 1); e.Replace == nil {
				t.Fatal("not replaced")
			}
			s.HandlerSpawned()
			l := s.Lease(at(20), true, nil)
			wantSends(t, l, [2]int{1, 1})
			if l.Sends[0].Free != 1 {
				t.Fatalf("charged: %+v", l.Sends)
			}
		}},
		{"FreeAttemptsAreNotChargedToTheBudget", func(t *testing.T) {
			s := New(cfg(1))
			i, _ := id(take(t, s, evs("a")), 1)
			for h := uint64(1); h <= 4; h++ {
				s.HandlerStopped(t0, h)
				s.HandlerSpawned()
				s.Lease(t0, true, nil)
			}
			e := s.Answered(t0, Answer{ID: i, Attempt: 4, Outcome: Retry})
			if len(e.Letters) != 0 || len(e.Redeliver) != 1 {
				t.Fatalf("dead-lettered after one failure of its own: %+v", e)
			}
		}},
		{"ADrainSendsARetryAtOnceOnceAndLeavesItIfItFailsAgain", func(t *testing.T) {
			s := New(cfg(2))
			e := take(t, s, evs("a", "b"))
			i1, _ := id(e, 1)
			i2, _ := id(e, 2)
			s.Answered(t0, Answer{ID: i1, Outcome: Retry, After: time.Hour})
			s.Answered(t0, Answer{ID: i2})
			d := s.Drain()
			if !d.CheckLease || d.Drained {
				t.Fatalf("drain: %+v", d)
			}
			wantSends(t, s.Lease(t0, true, nil), [2]int{1, 1})
			if r := s.Redeliver(at(1), i1, 1); r.CheckLease {
				t.Fatal("a redelivery acted in a drain")
			}
			a := s.Answered(t0, Answer{ID: i1, Attempt: 1, Outcome: Retry})
			if !a.Drained || a.CheckLease {
				t.Fatalf("the drain sends the retry again, or does not end: %+v", a)
			}
		}},
		{"ADrainWaitsForTheHandlerToSendWhatItMust", func(t *testing.T) {
			s := New(cfg(2))
			e := take(t, s, evs("a", "b"))
			i1, _ := id(e, 1)
			i2, _ := id(e, 2)
			s.Answered(t0, Answer{ID: i2})
			s.Drain()
			if r := s.HandlerStopped(t0, 1); r.Drained {
				t.Fatal("drained with event 1 to send again")
			}
			s.HandlerSpawned()
			wantSends(t, s.Lease(t0, true, nil), [2]int{1, 1})
			if f := s.Answered(t0, Answer{ID: i1, Attempt: 1}); !f.Drained || f.Finished.Slots != 2 {
				t.Fatalf("answer: %+v", f)
			}
		}},
		{"ADrainLeavesWhatWaitsAfterTheLastSlotSent", func(t *testing.T) {
			s := New(cfg(3))
			e := take(t, s, evs("a", "a", "a"))
			i1, _ := id(e, 1)
			d := s.Drain()
			if d.Drained || s.Room() != 0 {
				t.Fatalf("drain: %+v", d)
			}
			if f := s.Answered(t0, Answer{ID: i1}); !f.Drained || f.CheckLease {
				t.Fatalf("the drain sends what waits behind the last sent: %+v", f)
			}
		}},
		{"ACarriedRetryStartsAtItsAttempt", func(t *testing.T) {
			s := New(cfg(1))
			e := take(t, s, []Event{{Pos: 4, Stream: "a", Attempt: 2, Free: 1}})
			if e.Sends[0].Attempt != 2 || e.Sends[0].Free != 1 {
				t.Fatalf("sent %+v", e.Sends)
			}
		}},
	} {
		t.Run(tc.name, tc.run)
	}
}
