package window

import "testing"

func TestParkedStreams(t *testing.T) {
	t.Run("AParkedEventIsDoneAsItIsTakenAndNeverSent", func(t *testing.T) {
		s := New(cfg(1))
		events := evs("a", "b")
		events[0].Parked = true
		n, e := s.Take(events[:1])
		if n != 1 || e.Finished.Events != 1 || e.Finished.Through != 1 || e.CheckLease || s.Len() != 0 {
			t.Fatalf("took %d: %+v, %d held", n, e, s.Len())
		}
		wantSends(t, take(t, s, events[1:]), [2]int{2, 0})
	})
	t.Run("ParkingFinishesTheLetterAndTheStreamsLaterSlotsNotOthers", func(t *testing.T) {
		s := New(cfg(4))
		e := take(t, s, evs("a", "b", "a", "a"))
		wantSends(t, e, [2]int{1, 0}, [2]int{2, 0})
		a, att := id(e, 1)
		b, batt := id(e, 2)
		e = s.Answered(t0, Answer{ID: a, Attempt: att, Outcome: DeadLettered, Reason: "poison"})
		if len(e.Letters) != 1 || e.Letters[0].Pos != 1 || len(e.Sends) != 0 || e.CheckLease {
			t.Fatalf("dead-lettered: %+v", e)
		}
		// Until the park lands, the stream is held: nothing of it goes.
		e = s.Parked(e.Letters[0].ID)
		if e.Finished.Events != 1 || e.Finished.Through != 1 || e.CheckLease {
			t.Fatalf("parked: %+v (%s)", e, s)
		}
		// b's ack moves the prefix over a's later slots, never sent.
		e = s.Answered(t0, Answer{ID: b, Attempt: batt, Outcome: Acked})
		if e.Finished.Events != 3 || e.Finished.Through != 4 || len(e.Sends) != 0 || e.CheckLease || s.Len() != 0 {
			t.Fatalf("b acked: %+v (%s)", e, s)
		}
	})
	t.Run("ABatchStopsBeforeAParkedEvent", func(t *testing.T) {
		s := New(bcfg(5, 0))
		events := evs("a", "b", "c", "d")
		events[2].Parked = true
		wantBatch(t, batchOf(t, s, events), 1, 1, 2)
	})
	t.Run("ARunStopsBeforeAParkedEvent", func(t *testing.T) {
		c := cfg(1)
		c.RunEvents = 10
		s := New(c)
		e := take(t, s, evs("a"))
		a, att := id(e, 1)
		s.Answered(t0, Answer{ID: a, Attempt: att, Outcome: Acked, Runs: true})
		events := evs("x", "b", "c", "d")[1:]
		events[1].Parked = true
		_, e = s.Take(events[:1])
		if !e.CheckLease {
			t.Fatalf("no lease check: %+v", e)
		}
		e = s.Lease(t0, true, events[1:])
		if len(e.Sends) != 1 || len(e.Sends[0].Events) != 1 || e.Absorbed != 0 {
			t.Fatalf("run %+v absorbing %d, want event 2 alone", e.Sends, e.Absorbed)
		}
	})
	t.Run("AnAnswerToALetterNotBeingWrittenParksNothing", func(t *testing.T) {
		s := New(cfg(2))
		e := take(t, s, evs("a", "a"))
		a, _ := id(e, 1)
		if e := s.Parked(a); e.Finished.Events != 0 || s.Len() != 2 {
			t.Fatalf("parked a slot with the handler: %+v", e)
		}
	})
}
