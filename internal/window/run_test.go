package window

import (
	"testing"
)

func rcfg(events int) Config {
	c := cfg(1)
	c.RunEvents = events
	return c
}

// runOf makes s's handler take runs (its first answer says so), then
// takes events[0] and sends it as a run with events[1:] pending.
func runOf(t *testing.T, s *State, events []Event) Send {
	t.Helper()
	e := take(t, s, []Event{{Pos: 0, Stream: "z"}})
	s.Answered(t0, Answer{ID: e.Sends[0].ID, Runs: true})
	if n, e := s.Take(events[:1]); n != 1 || !e.CheckLease {
		t.Fatalf("take: %d %+v", n, e)
	}
	r := s.Lease(t0, true, events[1:])
	if len(r.Sends) != 1 || r.Sends[0].Run == 0 {
		t.Fatalf("not sent as a run: %+v", r)
	}
	return r.Sends[0]
}

func TestRunRules(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"ARunTakesThePendingEventsUpToRunEvents", func(t *testing.T) {
			s := New(rcfg(3))
			r := runOf(t, s, evs("a", "b", "a", "c"))
			if got := poss(r.Events); len(got) != 3 || got[2] != 3 {
				t.Fatalf("run of %v", got)
			}
		}},
		{"AHandlerTakesRunsOnlyOnceItSaysSo", func(t *testing.T) {
			s := New(rcfg(3))
			e := take(t, s, evs("a", "b"))
			if e.Sends[0].Run != 0 {
				t.Fatalf("a run before the handler said it takes them: %+v", e.Sends)
			}
		}},
		{"ARunAckedInPartFinishesItsPrefixAndAnswersForItsHead", func(t *testing.T) {
			s := New(rcfg(3))
			r := runOf(t, s, evs("a", "b", "a"))
			f := s.RunAnswered(t0, RunOutcome{Run: r.Run, Done: 1, Next: Retry})
			if f.Finished != (Finished{Events: 1, Through: 1}) || len(f.Redeliver) != 1 || f.Redeliver[0].Attempt != 1 {
				t.Fatalf("answer: %+v", f)
			}
			wantPutBack(t, f, 3)
		}},
		{"ARunCutShortLeavesItsHeadWaitingUncharged", func(t *testing.T) {
			s := New(rcfg(3))
			r := runOf(t, s, evs("a", "b", "a"))
			f := s.RunAnswered(t0, RunOutcome{Run: r.Run, Done: 1, Cut: true})
			wantPutBack(t, f, 3)
			if !f.CheckLease || len(f.Redeliver) != 0 {
				t.Fatalf("answer: %+v", f)
			}
			if n := s.Lease(t0, true, evs("a", "b", "a")[2:]); n.Sends[0].Pos != 2 || n.Sends[0].Attempt != 0 {
				t.Fatalf("the head sent as %+v", n.Sends)
			}
		}},
		{"ARunLateInItsEventInHandIsEndedAndCharged", func(t *testing.T) {
			s := New(rcfg(3))
			r := runOf(t, s, evs("a", "b", "a"))
			s.RunProgress(at(50), true)
			if f := s.Tick(at(120)); f.EndRun != nil {
				t.Fatalf("late though its event in hand started at 50: %+v", f)
			}
			f := s.Tick(at(150))
			if f.EndRun == nil || !f.EndRun.Late {
				t.Fatalf("late from its event's start (50): %+v", f)
			}
			g := s.RunEnded(at(150), RunOutcome{Run: r.Run, Done: 1, InHand: true, Cut: true})
			if g.Probe == 0 || len(g.Redeliver) != 1 || g.Redeliver[0].Attempt != 1 || g.Finished.Events != 1 {
				t.Fatalf("ended: %+v", g)
			}
		}},
		{"ARunOfAReplacedHandlerGoesToItsSuccessorUncharged", func(t *testing.T) {
			s := New(rcfg(3))
			r := runOf(t, s, evs("a", "b", "a"))
			s.RunProgress(at(5), true)
			f := s.HandlerStopped(at(10), 1)
			if f.EndRun == nil || f.EndRun.Late {
				t.Fatalf("stopped: %+v", f)
			}
			s.RunEnded(at(10), RunOutcome{Run: r.Run, InHand: true, Cut: true})
			s.HandlerSpawned()
			n := s.Lease(at(10), true, nil)
			if len(n.Sends) != 1 || n.Sends[0].Attempt != 1 || n.Sends[0].Free != 1 || n.Sends[0].Run != 0 {
				t.Fatalf("sent to the successor (not taking runs yet) as %+v", n.Sends)
			}
		}},
		{"ADrainCutsTheRunShort", func(t *testing.T) {
			s := New(rcfg(3))
			runOf(t, s, evs("a", "b", "a"))
			if d := s.Drain(); !d.CutRun {
				t.Fatalf("drain: %+v", d)
			}
		}},
		{"AStoppedReaderLeavesARunsHeadGivenUp", func(t *testing.T) {
			s := New(rcfg(3))
			r := runOf(t, s, evs("a", "b", "a"))
			l, ok, done := s.LeftRun(RunOutcome{Run: r.Run, Done: 1, InHand: true, Cut: true})
			if !ok || done != 1 || l.Pos != 2 || l.Attempt != 1 || l.Free != 1 {
				t.Fatalf("left %+v %v %d", l, ok, done)
			}
			if _, ok, _ := s.LeftRun(RunOutcome{Run: r.Run, Done: 1, Cut: true}); ok {
				t.Fatal("left a new delivery's head not started")
			}
			if _, ok, _ := s.LeftRun(RunOutcome{Run: r.Run, Cut: true}); ok {
				t.Fatal("left a run's first event not started, a first attempt")
			}
		}},
		{"AStoppedReaderLeavesARetryRunNotStartedAtItsAttempt", func(t *testing.T) {
			s := New(rcfg(3))
			events := evs("a", "b", "a")
			r := runOf(t, s, events)
			f := s.RunAnswered(t0, RunOutcome{Run: r.Run, Next: Retry})
			if len(f.Redeliver) != 1 || f.Redeliver[0].Attempt != 1 {
				t.Fatalf("answer: %+v", f)
			}
			if g := s.Redeliver(at(20), f.Redeliver[0].ID, 1); !g.CheckLease {
				t.Fatalf("redeliver: %+v", g)
			}
			again := s.Lease(at(20), true, events[1:])
			if len(again.Sends) != 1 || again.Sends[0].Run == 0 || again.Sends[0].Attempt != 1 {
				t.Fatalf("the retry sent as %+v", again.Sends)
			}
			l, ok, done := s.LeftRun(RunOutcome{Run: again.Sends[0].Run, Cut: true})
			if !ok || done != 0 || l.Pos != 1 || l.Attempt != 1 || l.Free != 0 {
				t.Fatalf("left %+v %v %d, want event 1 at attempt 1, free 0", l, ok, done)
			}
		}},
		{"ARunAnsweredAsItsHandlerIsReplacedIsCharged", func(t *testing.T) {
			c := rcfg(3)
			c.MaxAttempts = 1
			s := New(c)
			r := runOf(t, s, evs("a", "b", "a"))
			f := s.HandlerStopped(at(10), 1)
			if f.EndRun == nil || f.EndRun.Late {
				t.Fatalf("stopped: %+v", f)
			}
			g := s.RunEnded(at(10), RunOutcome{Run: r.Run, Next: Panicked, Reason: "boom"})
			if len(g.Letters) != 1 || !g.Letters[0].Budget || g.Letters[0].Pos != 1 {
				t.Fatalf("a panic answered as the handler was replaced, budget 1, not charged: %+v", g)
			}
		}},
	} {
		t.Run(tc.name, tc.run)
	}
}
