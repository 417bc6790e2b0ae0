package checkpointing

import "fmt"

// Phase is what the checkpoint side is doing.
type Phase uint8

const (
	// Idle: no write is out.
	Idle Phase = iota
	// Writing: one write is out; no other starts before its answer.
	Writing
	// Abandoned: a write failed under an unsure lease; none is tried
	// again, and a drain ends without one.
	Abandoned
)

// String names the phase as diagnostics print it.
func (p Phase) String() string {
	switch p {
	case Idle:
		return "idle"
	case Writing:
		return "writing"
	case Abandoned:
		return "abandoned"
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// Config is what the state is built with.
type Config struct {
	// Every is how many acknowledged events start a write
	// (GroupOptions.CheckpointEvery).
	Every int
}

// Env is what the state reads of the world at an input.
type Env struct {
	// Unsure: the reader can no longer be sure it holds its lease
	// (EnsureHeld failed); it drains and stops.
	Unsure bool
}

// Write is an effect: write the checkpoint at Pos, fenced, and answer
// with [State.Written] or [State.Failed] naming ID.
type Write struct {
	ID  uint64
	Pos int64
}

// Effects are what the actor carries out after an input.
type Effects struct {
	// Write, if set, is the checkpoint write to start now. At most one
	// is out.
	Write *Write
	// Progress: a write landed; tell the coordinator the position
	// written ([State.Flushed]).
	Progress bool
}

// Ack is what the delivery window finished, as the checkpoint side takes
// it.
type Ack struct {
	// Through is the last position of the window's finished prefix after
	// the input; Events how many events that prefix moved over (0: the
	// prefix did not move, Through is ignored).
	Through int64
	Events  int
	// Committed, if not 0, is the last position of a delivery whose
	// handler wrote the checkpoint itself with its own writes
	// (CommitWithCheckpoint): written, whether or not the prefix reached
	// it.
	Committed int64
}

// Failure is how a write failed, as the actor classifies its error.
type Failure uint8

const (
	// Transient: a dropped connection, a timeout, a serialization
	// failure — worth trying again in place.
	Transient Failure = iota
	// FenceLost: another worker holds the bucket.
	FenceLost
	// ServerChanged: the store is another server (a failover), or the
	// head went back (a restore): positions of another server.
	ServerChanged
	// Permanent: anything else (a missing table, a missing grant).
	Permanent
)

// String names the failure for the simulation's trace.
func (f Failure) String() string {
	return [...]string{"transient", "fence lost", "server changed", "permanent"}[f]
}

// Verdict is what a failed write makes the reader do.
type Verdict uint8

const (
	// Stale: the answer is of a write the state no longer waits for;
	// nothing to do.
	Stale Verdict = iota
	// RetryOnTick: the next tick writes again; the reader goes on (and
	// keeps checking its lease).
	RetryOnTick
	// StopLost: stop at once and tell the coordinator the fence is lost.
	StopLost
	// NewEpoch: restart from the checkpoint stored on the new server.
	NewEpoch
	// Fail: a failure for supervision (the reader panics with it).
	Fail
	// EndUnwritten: under an unsure lease no write is tried again; the
	// reader lets its events in flight finish and ends its drain
	// without one (see [State.Drain]).
	EndUnwritten
)

// String names the verdict for the simulation's trace.
func (v Verdict) String() string {
	return [...]string{"stale", "retry on tick", "stop: fence lost", "new epoch", "fail", "end unwritten"}[v]
}

// State is one reader incarnation's checkpoint side. The zero value is
// not usable: see [New].
type State struct {
	cfg     Config
	phase   Phase
	acked   int64 // the window's finished prefix reaches here
	flushed int64 // written (by this side, or by a handler's commit)
	since   int   // events acknowledged since the last write started
	out     Write // the write out (Writing)
	writes  uint64
}

// New returns a state in [Idle] at position 0 (see [State.Resume]).
func New(cfg Config) *State { return &State{cfg: cfg} }

// Phase returns what the state is doing.
func (s *State) Phase() Phase { return s.phase }

// Acked is the position through which every event was handled — acked
// or dead-lettered — here or by a predecessor at this epoch.
func (s *State) Acked() int64 { return s.acked }

// Flushed is the position known written.
func (s *State) Flushed() int64 { return s.flushed }

// Out returns the write out, if any.
func (s *State) Out() (Write, bool) { return s.out, s.phase == Writing }

// String is the state in one line, for diagnostics and the simulation's
// trace.
func (s *State) String() string {
	out := "none"
	if s.phase == Writing {
		out = fmt.Sprintf("#%d at %d", s.out.ID, s.out.Pos)
	}
	return fmt.Sprintf("%s acked %d flushed %d since %d write %s", s.phase, s.acked, s.flushed, s.since, out)
}

// Resume starts the state, the checkpoint loaded: after the checkpoint,
// or after what the reader's predecessors at its epoch in this process
// handled (mark), if that is further — and then writes that position at
// once (see the actor's resumeAt: why starting after the mark is safe).
func (s *State) Resume(checkpoint, mark int64) Effects {
	from := max(checkpoint, mark)
	if fault == faultResumeIgnoresMark {
		from = checkpoint
	}
	s.acked, s.flushed = from, checkpoint
	if from > checkpoint && fault != faultResumeUnwritten {
		return s.flush(true)
	}
	return Effects{}
}

// Finished takes what the window finished: the acknowledged position moves
// over the finished prefix, and CheckpointEvery events acknowledged since
// the last write start the next.
func (s *State) Finished(a Ack) Effects {
	if a.Events > 0 {
		s.acked = a.Through
		s.since += a.Events
	}
	if a.Committed != 0 {
		s.flushed = max(s.flushed, a.Committed)
	}
	if s.since >= s.cfg.Every {
		return s.flush(false)
	}
	return Effects{}
}

// Cut takes a drain to a resize's cut at pos, written with the drained
// mark in one transaction: acked and written through it.
func (s *State) Cut(pos int64) {
	s.acked, s.flushed = max(s.acked, pos), max(s.flushed, pos)
}

// Tick writes what is acknowledged and not written yet
// (CheckpointInterval), unless a write is out.
func (s *State) Tick() Effects {
	return s.flush(fault != faultTickNotForced)
}

// flush starts a write of the acked position unless one is out, none may
// be tried (Abandoned), nothing is unwritten, or — not forced — fewer
// than CheckpointEvery events were acknowledged since the last.
func (s *State) flush(force bool) Effects {
	if (s.phase == Writing && fault != faultWritesOverlap) || s.phase == Abandoned || s.acked <= s.flushed ||
		(!force && s.since < s.cfg.Every) {
		return Effects{}
	}
	s.writes++
	s.phase, s.since, s.out = Writing, 0, Write{ID: s.writes, Pos: s.acked}
	w := s.out
	return Effects{Write: &w}
}

// Written takes a write's success.
func (s *State) Written(id uint64) Effects {
	if s.phase != Writing || id != s.out.ID {
		if fault != faultWritesOverlap || s.phase == Abandoned {
			return Effects{} // a write given up: no news
		}
	}
	s.phase = Idle
	if fault == faultWrittenNotMax {
		s.flushed = s.out.Pos
	} else {
		s.flushed = max(s.flushed, s.out.Pos)
	}
	return Effects{Progress: true}
}

// Failed takes a write's failure and says what the reader does.
func (s *State) Failed(id uint64, f Failure, env Env) Verdict {
	if s.phase != Writing || id != s.out.ID {
		return Stale
	}
	s.phase = Idle
	switch {
	case f == FenceLost:
		// The bucket is gone: stop, and leave the rest to its owner.
		return StopLost
	case env.Unsure:
		// A write under an unsure lease failed: no other is tried. The
		// reader still lets its events in flight finish before it
		// stops: stopped at once, it would drop the answers of events
		// its handler may be finishing, and the next reader at this
		// epoch — which starts after everything acked here — would
		// deliver them again.
		if fault == faultUnsureFailureStopsAtOnce {
			return StopLost
		}
		s.phase = Abandoned
		return EndUnwritten
	case f == ServerChanged:
		// Retried, the write could land once the new server's head
		// passes it, and skip what that server handed out again.
		return NewEpoch
	case f == Transient:
		// Restarting would forget what was acked since the last write
		// and deliver it again.
		if fault == faultTransientRestarts {
			return Fail
		}
		return RetryOnTick
	}
	return Fail
}

// Drain is asked once nothing of the window is with the handler or being
// dead-lettered: it starts the last write, or reports the drain may end
// (done) — everything acknowledged written, or, under an unsure lease,
// its write failed.
func (s *State) Drain(env Env) (e Effects, done bool) {
	if s.phase == Abandoned || (fault == faultUnsureDrainUnwritten && env.Unsure) {
		return Effects{}, true
	}
	if s.acked > s.flushed && fault != faultDrainUnwritten {
		return s.flush(true), false
	}
	return Effects{}, s.phase != Writing
}

// fault re-injects one of the checkpoint side's past bugs (0: none), for
// the simulation to find; set only by TestSimFindsTheFaults, never by the
// code.
var fault faultKind

type faultKind uint8

const (
	faultNone faultKind = iota
	// A reader spawned again at the same epoch starts from the stored
	// checkpoint, not after what its predecessor handled (d0b7497).
	faultResumeIgnoresMark
	// A reader that resumes after its predecessor's mark does not write
	// it at once (d0b7497).
	faultResumeUnwritten
	// An unsure reader stops without writing what it acked (ef14de6).
	faultUnsureDrainUnwritten
	// An unsure reader whose write fails stops at once, its events in
	// flight unanswered (d0964d3).
	faultUnsureFailureStopsAtOnce
	// A transient write failure restarts the reader (5384914).
	faultTransientRestarts
	// A drain ends without its last write (b25d0d0: a drain flushes
	// before it ends).
	faultDrainUnwritten
	// The tick writes only once CheckpointEvery events are acknowledged
	// (ff0d863: one timer for the checkpoint interval).
	faultTickNotForced
	// A write starts while one is out (the flushing guard).
	faultWritesOverlap
	// A write's success sets the written position to its own, below a
	// handler's commit since (not a past bug: a mutation of the max).
	faultWrittenNotMax
)
