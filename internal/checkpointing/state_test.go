package checkpointing

import "testing"

func write(t *testing.T, e Effects, pos int64) Write {
	t.Helper()
	if e.Write == nil || e.Write.Pos != pos {
		t.Fatalf("expected a write at %d, got %+v", pos, e.Write)
	}
	return *e.Write
}

func noWrite(t *testing.T, e Effects) {
	t.Helper()
	if e.Write != nil {
		t.Fatalf("expected no write, got one at %d", e.Write.Pos)
	}
}

func TestEveryEventsStartAWriteAndATickWritesTheRest(t *testing.T) {
	s := New(Config{Every: 3})
	noWrite(t, s.Resume(10, 0))
	noWrite(t, s.Finished(Ack{Through: 11, Events: 1}))
	noWrite(t, s.Finished(Ack{Through: 13, Events: 1}))
	w := write(t, s.Finished(Ack{Through: 14, Events: 1}), 14)
	noWrite(t, s.Finished(Ack{Through: 20, Events: 3})) // one write at a time
	noWrite(t, s.Tick())
	if e := s.Written(w.ID); !e.Progress || s.Flushed() != 14 {
		t.Fatalf("written: %+v, flushed %d", e, s.Flushed())
	}
	write(t, s.Tick(), 20)
}

func TestAReaderResumingAfterItsMarkWritesItAtOnce(t *testing.T) {
	s := New(Config{Every: 100})
	write(t, s.Resume(10, 25), 25)
	if s.Acked() != 25 || s.Flushed() != 10 {
		t.Fatalf("acked %d flushed %d", s.Acked(), s.Flushed())
	}
}

func TestAStaleWriteAnswerChangesNothing(t *testing.T) {
	s := New(Config{Every: 1})
	s.Resume(0, 0)
	w := write(t, s.Finished(Ack{Through: 5, Events: 1}), 5)
	if e := s.Written(w.ID + 1); e.Progress || s.Phase() != Writing {
		t.Fatalf("a stale answer was taken: %s", s)
	}
	if v := s.Failed(w.ID+1, Transient, Env{}); v != Stale {
		t.Fatalf("a stale failure: %s", v)
	}
}

func TestAFailedWriteUnderAnUnsureLeaseEndsTheDrainUnwritten(t *testing.T) {
	s := New(Config{Every: 1})
	s.Resume(0, 0)
	w := write(t, s.Finished(Ack{Through: 5, Events: 1}), 5)
	if v := s.Failed(w.ID, Transient, Env{Unsure: true}); v != EndUnwritten {
		t.Fatalf("verdict %s", v)
	}
	noWrite(t, s.Finished(Ack{Through: 6, Events: 1}))
	noWrite(t, s.Tick())
	if _, done := s.Drain(Env{Unsure: true}); !done {
		t.Fatal("the drain waits for a write that is never tried")
	}
}

func TestADrainEndsOnceItsLastWriteLanded(t *testing.T) {
	s := New(Config{Every: 100})
	s.Resume(0, 0)
	s.Finished(Ack{Through: 7, Events: 2})
	e, done := s.Drain(Env{})
	w := write(t, e, 7)
	if done {
		t.Fatal("done with a write out")
	}
	if _, done := s.Drain(Env{}); done {
		t.Fatal("done with a write out")
	}
	s.Written(w.ID)
	if _, done := s.Drain(Env{}); !done {
		t.Fatal("not done with everything written")
	}
}

func TestAFailedWritesVerdicts(t *testing.T) {
	for _, c := range []struct {
		f    Failure
		env  Env
		want Verdict
	}{
		{Transient, Env{}, RetryOnTick},
		{FenceLost, Env{}, StopLost},
		{FenceLost, Env{Unsure: true}, StopLost},
		{ServerChanged, Env{}, NewEpoch},
		{ServerChanged, Env{Unsure: true}, EndUnwritten},
		{Permanent, Env{}, Fail},
	} {
		s := New(Config{Every: 1})
		s.Resume(0, 0)
		w := write(t, s.Finished(Ack{Through: 1, Events: 1}), 1)
		if v := s.Failed(w.ID, c.f, c.env); v != c.want {
			t.Errorf("%s (unsure %v): %s, want %s", c.f, c.env.Unsure, v, c.want)
		}
	}
}

func TestAHandlersCommitCountsAsWritten(t *testing.T) {
	s := New(Config{Every: 100})
	s.Resume(0, 0)
	s.Finished(Ack{Through: 4, Events: 1, Committed: 4})
	noWrite(t, s.Tick())
	if _, done := s.Drain(Env{}); !done {
		t.Fatal("a drain waits for what the handler committed")
	}
}
