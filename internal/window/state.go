package window

import (
	"fmt"
	"strings"
	"time"
)

// Config is what a window is built with.
type Config struct {
	// MaxInFlight is how many slots the window holds at most
	// (GroupOptions.MaxInFlight); 1 delivers strictly one at a time.
	MaxInFlight int
	// MaxAttempts is the retry budget: an event whose charged attempts
	// reach it is dead-lettered (RetryPolicy.MaxAttempts).
	MaxAttempts int
	// Timeout is how long a delivery may stay unanswered
	// (GroupOptions.HandlerTimeout); ProbeWait how long a probed handler
	// has to answer before it is taken for hung.
	Timeout, ProbeWait time.Duration
	// Backoff is the least wait before attempt n (counted from 0) of a
	// retried event; nil waits nothing.
	Backoff func(n int) time.Duration
	// Batch, its MaxEvents set, makes every slot a batch
	// (GroupOptions.Batch; MaxInFlight must be 1): see [State.Lease].
	Batch Batch
	// RunEvents, if not 0, is the most events a function handler's run
	// takes (the actor's runEvents: maxRunEvents and CheckpointEvery at
	// most): with MaxInFlight 1 and no batches, a handler that says it
	// takes runs (Answer.Runs) is sent each slot as a run (see
	// [State.RunAnswered]).
	RunEvents int
}

// Batch bounds a batch: at most MaxEvents events, and, MaxBytes set, no
// more than MaxBytes of their Event.Size together (a first event larger
// goes alone).
type Batch struct {
	MaxEvents, MaxBytes int
}

// on reports whether slots are batches.
func (b Batch) on() bool { return b.MaxEvents > 0 }

// Event is an event the window takes, in position order.
type Event struct {
	Pos    int64
	Stream string
	// Err is set when the store holds the event but cannot give it back:
	// it is dead-lettered with this reason, never sent to the handler.
	Err error
	// Attempt and Free are a retry a predecessor left (the actor's
	// carried attempts): the slot starts at this attempt, Free of its
	// attempts not charged to its budget.
	Attempt, Free int
	// Letter is a dead letter a predecessor was writing when it stopped
	// at once (see [State.Left]): the slot writes it again, in its turn,
	// and never sends the event.
	Letter *Letter
	// Size is what the event counts against Batch.MaxBytes (its data and
	// metadata).
	Size int
	// Parked: the event's stream is parked (see parked.go): its slot is
	// done as it is taken, never sent, and no batch or run takes it.
	Parked bool
}

// Outcome is what a handler's answer to a delivery says.
type Outcome uint8

const (
	// Acked: the event is handled.
	Acked Outcome = iota
	// Retry: try again after Answer.After at least (or a handler that
	// answered with something that is not an answer).
	Retry
	// Panicked: the handler panicked; retried like Retry.
	Panicked
	// DeadLettered: the handler gave up on the event: dead-letter it.
	DeadLettered
	// BatchAcked: a batch's BatchAck — Answer.Done of its events, from
	// the first, are handled, and, if not all, Answer.Next is the answer
	// for the first not done (the actor gives Retry for a BatchAck
	// without Next). A BatchAck whose Done lies outside the batch is a
	// Retry (the actor's classifyBatchAnswer).
	BatchAcked
)

// String names the outcome.
func (o Outcome) String() string {
	return [...]string{"ack", "retry", "panic", "dead-letter", "batch-ack"}[o]
}

// Answer is a handler's answer to one delivery, naming it by ID and
// Attempt (see [Send]).
type Answer struct {
	ID      uint64
	Attempt int
	Outcome Outcome
	// After is the least wait a Retry asked for.
	After  time.Duration
	Reason string
	// Committed: an ack whose handler wrote the checkpoint itself (of a
	// BatchAck: of its Done events).
	Committed bool
	// Done and Next are a BatchAck's (see [BatchAcked]); Next's wait and
	// reason are After and Reason, NextCommitted is a Next Acked's
	// Committed.
	Done          int
	Next          Outcome
	NextCommitted bool
	// Runs: the handler says it takes runs (a function handler's
	// answers; see Config.RunEvents).
	Runs bool
}

// Send is an effect: deliver the event to the handler, as attempt
// Attempt of delivery ID. Its answer names both back.
type Send struct {
	ID      uint64
	Attempt int
	// Free of its attempts are not charged to its budget.
	Free   int
	Pos    int64
	Stream string
	// Handler is the handler it goes to (see [ReplaceHandler]).
	Handler uint64
	// Events, for a batch, are its events: the slot's own first
	// (Pos), then those it took from the pending list (see
	// [State.Lease]). Nil for a single delivery.
	Events []Event
	// Run, if not 0, numbers a run (Events its events): its outcome
	// names it ([RunOutcome]).
	Run uint64
}

// RunOutcome is a run's state as the actor takes it, from the run's
// answer or from its end by the reader (actors/funcrun.go runOutcome).
type RunOutcome struct {
	// Run is the run's Send.Run.
	Run uint64
	// Done events were acked, from the first; Committed: the last of
	// them with its checkpoint.
	Done      int
	Committed bool
	// InHand: ended by the reader while event Done was being handled.
	InHand bool
	// Cut: no answer for event Done — the run was cut short before it
	// (a drain, its time slice, the resize bound, EnsureHeld failed:
	// Unsure) or did not start it. Else Next (with After and Reason) is
	// the handler's answer for it.
	Cut    bool
	Next   Outcome
	After  time.Duration
	Reason string
	Unsure bool
}

// EndRun is an effect: end the run (run.end) and give its outcome to
// [State.RunEnded] before any other input. Late: its event in hand is
// unanswered for Timeout; else its handler is replaced.
type EndRun struct {
	Run  uint64
	Late bool
}

// Redelivery is an effect: call [State.Redeliver] with ID and Attempt at
// At.
type Redelivery struct {
	ID      uint64
	Attempt int
	At      time.Time
}

// Letter is an effect: write the event's dead letter, and answer with
// [State.LetterWritten] or [State.LetterFailed] naming ID.
type Letter struct {
	ID       uint64
	Pos      int64
	Stream   string
	Reason   string
	Attempts int
	// Budget: its retry budget is spent (not a handler's dead letter or
	// an unreadable event).
	Budget bool
}

// ReplaceHandler is an effect: stop handler Old and spawn its successor
// after the backoff for Fails replacements in a row, then call
// [State.HandlerSpawned].
type ReplaceHandler struct {
	Old   uint64
	Fails int
	// Hung, when the handler is replaced for not answering its probe, is
	// the late delivery that got it probed, sent at SentAt (for the
	// actor's Warn log); nil when it stopped.
	Hung   *Send
	SentAt time.Time
}

// GivenUp is an effect: the window no longer waits for attempt Attempt
// of delivery ID — Late: unanswered for Timeout, a failed attempt;
// else sent again to a replaced handler's successor. Its context is
// cancelled and its span ended.
type GivenUp struct {
	ID      uint64
	Attempt int
	Late    bool
}

// Finished is how far the window's finished prefix moved at an input.
type Finished struct {
	// Slots is how many leading slots finished; Events how many events
	// the prefix moved over (a batch's slot counts its events, and a
	// batch acked in part moves it over its done events without its
	// slot finishing; 0: the prefix did not move); Through is the
	// position of the last of them.
	Slots   int
	Events  int
	Through int64
	// Committed, if not 0, is the position of an acked event whose
	// handler wrote the checkpoint itself.
	Committed int64
}

// Effects are what the actor carries out after an input, in this order:
// the finished prefix to the checkpoint side, then the rest. Sends is the
// window's, good until its next input.
type Effects struct {
	// CheckLease: something is to be sent; check the lease and answer
	// with [State.Lease]. Nothing is sent before.
	CheckLease bool
	Sends      []Send
	// Absorbed is how many of the pending events given to [State.Lease]
	// the batches sent took: the actor drops them from its pending list.
	Absorbed int
	// PutBack are events a batch took and did not finish: the actor puts
	// them back at the front of its pending list, in this order.
	PutBack   []Event
	Redeliver []Redelivery
	Letters   []Letter
	// Probe, if not 0, is a probe to send the handler; its answer is
	// [State.ProbeAnswered] with this number.
	Probe    uint64
	Replace  *ReplaceHandler
	GivenUp  []GivenUp
	Finished Finished
	// Drained: a drain has nothing left with the handler or the store,
	// and nothing more to send: the checkpoint side's last write may
	// start (checkpointing.State.Drain).
	Drained bool
	// SpawnNow: a drain began while the handler is replaced, with
	// something to send: spawn the successor at once, not after the
	// backoff, and call [State.HandlerSpawned].
	SpawnNow bool
	// EndRun, if not nil: end the run in flight (see [EndRun]).
	EndRun *EndRun
	// CutRun: the window drains: the run in flight is to start no
	// further event (run.cutShort).
	CutRun bool
}

type slotState uint8

const (
	waiting       slotState = iota // not sent, or to be sent again
	sent                           // with the handler, unanswered
	retrying                       // a redelivery is scheduled
	deadLettering                  // its letter is being written
	done
)

type letterState uint8

const (
	letterWriting letterState = iota
	letterFailed
)

type slot struct {
	id      uint64
	ev      Event
	state   slotState
	attempt int
	free    int
	sentAt  time.Time
	sent    Send   // the current attempt, as sent
	to      uint64 // the handler the current attempt went to
	letter  Letter
	lstate  letterState
	onDrain bool // a drain sent it once more at once
	due     bool // a retry whose delay passed, waiting for the handler
	// batch is the batch sent (Config.Batch on), batch[0] ev; nil when
	// not with the handler.
	batch []Event
	alone bool // the batch failed as a whole: its first event goes alone next
	// run is the run sent (0: none); batch is its events.
	run uint64
	// prev and next link the window's slots of one stream, in order, and
	// key is that stream (see [State.link]); nil while the window does
	// not link its slots (MaxInFlight 1).
	prev, next *slot
	key        string
}

// last is the position of the slot's last event.
func (sl *slot) last() int64 {
	if n := len(sl.batch); n > 0 {
		return sl.batch[n-1].Pos
	}
	return sl.ev.Pos
}

// count is the number of the slot's events.
func (sl *slot) count() int { return max(len(sl.batch), 1) }

// State is a reader's delivery window. The zero value is not usable: see
// [New].
type State struct {
	cfg      Config
	slots    []*slot // in position order
	ids      uint64
	handler  uint64 // the current handler; 0 while it is replaced
	handlers uint64
	fails    int // replacements since a handler last answered
	probe    uint64
	probeAt  time.Time
	probeSnd Send      // the late delivery that got the handler probed
	probeSnt time.Time // and when it was sent
	probes   uint64
	checking bool // a lease check is out
	draining bool
	unsure   bool
	runs     bool   // the handler takes runs
	nruns    uint64 // runs sent
	// the run in flight's event in hand, as the actor last saw it
	// (RunProgress)
	runSince  time.Time
	runInHand bool
	ending    *EndRun // a run the window asked to end
	// out and busy are sendable's, reused.
	out  []*slot
	busy streams
	// waiting counts the slots in the waiting state (see setState).
	waiting int
	// linked: the window links its slots of each stream (see link), tail
	// the last one of each stream; with MaxInFlight 1 it holds one slot,
	// whose stream is free at once, and links none.
	linked bool
	tail   map[string]*slot
	// spare are finished slots dropped, for Take to reuse.
	spare []*slot
	// sends is the array of Effects.Sends, reused: see [Effects].
	sends []Send
}

// New returns an empty window with handler 1 ready.
func New(cfg Config) *State {
	s := &State{cfg: cfg, handler: 1, handlers: 1, linked: cfg.MaxInFlight > 1}
	if s.linked {
		s.tail = map[string]*slot{}
	}
	return s
}

// setState moves sl to state st, keeping the count of waiting slots.
func (s *State) setState(sl *slot, st slotState) {
	if sl.state == waiting {
		s.waiting--
	}
	if st == waiting {
		s.waiting++
	}
	sl.state = st
}

// link appends sl, the window's last slot now, to its stream's slots.
func (s *State) link(sl *slot) {
	if !s.linked {
		return
	}
	sl.key = sl.ev.Stream
	if p := s.tail[sl.key]; p != nil {
		sl.prev, p.next = p, sl
	}
	s.tail[sl.key] = sl
}

// unlink takes sl, dropped from the window, out of its stream's slots.
func (s *State) unlink(sl *slot) {
	if !s.linked {
		return
	}
	if sl.prev != nil {
		sl.prev.next = sl.next
	}
	switch {
	case sl.next != nil:
		sl.next.prev = sl.prev
	case sl.prev != nil:
		s.tail[sl.key] = sl.prev
	default:
		delete(s.tail, sl.key)
	}
	sl.prev, sl.next = nil, nil
}

// relink links the window's slots again, after a slot's event changed
// stream (a batch acked in part: see ackPrefix).
func (s *State) relink() {
	if !s.linked {
		return
	}
	clear(s.tail)
	for _, sl := range s.slots {
		sl.prev, sl.next = nil, nil
		s.link(sl)
	}
}

// Room is how many events [State.Take] takes now: none while draining.
func (s *State) Room() int {
	if s.draining {
		return 0
	}
	n := s.cfg.MaxInFlight - len(s.slots)
	if fault == faultOverAdmits {
		n++
	}
	return max(n, 0)
}

// Take takes the first Room() events into the window and reports how
// many it took.
func (s *State) Take(events []Event) (int, Effects) {
	n := min(len(events), s.Room())
	for _, e := range events[:n] {
		s.ids++
		var sl *slot
		if k := len(s.spare); k > 0 {
			sl, s.spare = s.spare[k-1], s.spare[:k-1]
			*sl = slot{}
		} else {
			sl = new(slot)
		}
		sl.id, sl.ev, sl.attempt, sl.free = s.ids, e, e.Attempt, e.Free
		s.waiting++ // waiting, the zero state
		s.setState(sl, parkedState(e))
		s.slots = append(s.slots, sl)
		s.link(sl)
	}
	var eff Effects
	s.settle(&eff)
	return n, eff
}

// ready reports whether deliveries may go to the handler: it exists and
// no probe of it is out.
func (s *State) ready() bool {
	if fault == faultSendWhileProbing {
		return s.handler != 0
	}
	return s.handler != 0 && s.probe == 0
}

// streams tracks, over one pass of the slots in order, the streams with
// an unfinished slot so far: a slot is sent only when its stream has
// none before it.
type streams map[string]bool

// free reports whether no slot before sl's of its stream is unfinished.
func (b streams) free(sl *slot) bool { return fault == faultStreamJump || !b[sl.ev.Stream] }

// pass records sl, passed over in the pass.
func (b *streams) pass(sl *slot) {
	if sl.state == done {
		return
	}
	if *b == nil {
		*b = streams{}
	}
	(*b)[sl.ev.Stream] = true
}

// sendable is the slots to send now, handler readiness aside: outside a
// drain every waiting slot whose stream is free; in a drain the ones
// sendOnDrain sends (see [State.Drain]). The slice and the streams map
// are the window's, reused (an input allocates nothing for them once the
// window has run a while); the slice is good until the next call.
func (s *State) sendable() []*slot {
	if s.unsure {
		return nil
	}
	out := s.out[:0]
	if !s.draining {
		// The waiting slots are few (the ones just taken, or sent
		// again): each looks back for its stream, with no map to fill.
		left := s.waiting // the waiting slots not looked at yet
		for i := 0; left > 0; i++ {
			if sl := s.slots[i]; sl.state == waiting {
				if left--; s.streamFree(i) {
					out = append(out, sl)
				}
			}
		}
		return s.keep(out)
	}
	clear(s.busy)
	if fault == faultDrainLeavesRetries {
		s.keep(out)
		return nil
	}
	last := -1 // the last slot that left the waiting state
	for i, sl := range s.slots {
		if sl.state != waiting {
			last = i
		}
	}
	for _, sl := range s.slots[:max(last, 0)] {
		switch {
		case sl.state == retrying && sl.onDrain && fault != faultDrainResendsForEver:
			return s.keep(out) // left: what is sent after it would be repeated
		case sl.state == retrying, sl.state == waiting && s.busy.free(sl):
			out = append(out, sl)
		}
		s.busy.pass(sl)
	}
	return s.keep(out)
}

// keep keeps out, sendable's answer, for the next call, holding no slot
// beyond it (finished since, and reused).
func (s *State) keep(out []*slot) []*slot {
	clear(out[len(out):cap(out)])
	s.out = out
	return out
}

// streamFree reports whether no slot before slot i of its stream is
// unfinished.
func (s *State) streamFree(i int) bool {
	if fault == faultStreamJump {
		return true
	}
	if s.linked {
		for p := s.slots[i].prev; p != nil; p = p.prev {
			if p.state != done {
				return false
			}
		}
		return true
	}
	st := s.slots[i].ev.Stream
	for _, o := range s.slots[:i] {
		if o.state != done && o.ev.Stream == st {
			return false
		}
	}
	return true
}

// Lease takes the answer of a lease check: held, what is to be sent goes;
// not, the window drains under an unsure lease and sends nothing more.
//
// pending is the reader's pending list, the events after the window's,
// cut before the first beyond the resize bound (the actor's
// beyondBound): a batch sent takes the ones that follow its first event,
// up to Config.Batch's bounds and before an unreadable one (dead-lettered
// alone, as the first of a slot), and Effects.Absorbed says how many. A
// batch that failed as a whole (a panic, a timeout, a Retry, or an answer
// not a BatchAck) is sent as its first event alone, until its slot
// finishes or a BatchAck finds some of it done. Without batches pending is
// not looked at (nil will do).
func (s *State) Lease(now time.Time, held bool, pending []Event) Effects {
	var e Effects
	if !s.checking {
		return e
	}
	s.checking = false
	if !held {
		s.unsure, s.draining = true, true
		s.settle(&e)
		return e
	}
	s.sendNow(now, pending, &e)
	s.settle(&e)
	return e
}

// Unsure takes a lease found unsure elsewhere (a failed store call's
// check): the window drains and sends nothing more, as after
// [State.Lease] not held.
func (s *State) Unsure() Effects {
	var e Effects
	s.unsure, s.draining, s.checking = true, true, false
	s.settle(&e)
	return e
}

// sendNow sends what may be sent: an unreadable event is dead-lettered.
func (s *State) sendNow(now time.Time, pending []Event, e *Effects) {
	if !s.ready() {
		return
	}
	for _, sl := range s.sendable() {
		if s.draining && (sl.state == retrying || (sl.due && fault != faultDueNotOnDrain)) {
			sl.onDrain = true // a retry a drain sends: once
		}
		sl.due = false
		if l := sl.ev.Letter; l != nil {
			s.deadLetter(sl, l.Reason, l.Attempts, l.Budget, e) // written again, never sent
			continue
		}
		if err := sl.ev.Err; err != nil && fault != faultUnreadableSent {
			s.deadLetter(sl, err.Error(), 0, false, e)
			continue
		}
		s.send(now, sl, pending[min(e.Absorbed, len(pending)):], e)
	}
}

func (s *State) send(now time.Time, sl *slot, pending []Event, e *Effects) {
	s.setState(sl, sent)
	sl.sentAt, sl.to = now, s.handler
	switch {
	case s.cfg.Batch.on():
		sl.batch = s.takeBatch(sl, pending, e)
	case s.takesRuns():
		sl.batch = s.takeRun(sl, pending, e)
		s.nruns++
		sl.run = s.nruns
		s.runSince, s.runInHand = now, false
	}
	sl.sent = Send{ID: sl.id, Attempt: sl.attempt, Free: sl.free, Pos: sl.ev.Pos, Stream: sl.ev.Stream, Handler: s.handler,
		Events: sl.batch, Run: sl.run}
	if e.Sends == nil {
		e.Sends = s.sends[:0]
	}
	e.Sends = append(e.Sends, sl.sent)
	s.sends = e.Sends
}

// takeBatch makes the batch of a slot about to be sent: its event and the
// pending events that follow, within Config.Batch's bounds (one alone),
// up to an unreadable one (actors/batchdeliver.go takeBatch).
func (s *State) takeBatch(sl *slot, pending []Event, e *Effects) []Event {
	o := s.cfg.Batch
	limit := o.MaxEvents
	if sl.alone && fault != faultNotAlone {
		limit = 1
	}
	evs := make([]Event, 1, min(limit, 1+len(pending)))
	evs[0] = sl.ev
	size, n := sl.ev.Size, 0
	for ; n < len(pending) && len(evs) < limit; n++ {
		p := pending[n]
		size += p.Size
		if (p.Err != nil && fault != faultBatchTakesUnreadable) || p.Parked || (o.MaxBytes > 0 && size > o.MaxBytes && fault != faultBatchBytesIgnored) {
			break
		}
		evs = append(evs, p)
	}
	e.Absorbed += n
	return evs
}

// Runs reports whether the slot sent next goes as a run: [State.Lease]
// then looks at its pending list (the actor gives it the events a run
// may take).
func (s *State) Runs() bool { return s.takesRuns() }

// takesRuns reports whether slots go as runs: the handler said it takes
// them (Answer.Runs), with MaxInFlight 1 and no batches.
func (s *State) takesRuns() bool {
	return s.runs && s.cfg.RunEvents > 0 && s.cfg.MaxInFlight == 1 && !s.cfg.Batch.on()
}

// takeRun makes the run of a slot about to be sent: its event and the
// pending events that follow, RunEvents at most, up to an unreadable one
// (actors/funcrun.go sendRun).
func (s *State) takeRun(sl *slot, pending []Event, e *Effects) []Event {
	n, most := 0, s.cfg.RunEvents
	if fault == faultRunTakesOneMore {
		most++
	}
	for n < len(pending) && n+1 < most && pending[n].Err == nil && !pending[n].Parked {
		n++
	}
	e.Absorbed += n
	return append([]Event{sl.ev}, pending[:n]...)
}

// RunProgress takes what the actor sees of the run in flight before an
// input that may time it out or replace its handler (run.lateSince): the
// event in hand started at since, or none is (inHand false).
func (s *State) RunProgress(since time.Time, inHand bool) {
	s.runSince, s.runInHand = since, inHand
}

// runLate reports whether the run in flight's event in hand is late
// (actors/funcrun.go timeoutRun: measured from its start).
func (s *State) runLate(now time.Time) bool {
	return s.runInHand && now.Sub(s.runSince) >= s.cfg.Timeout
}

// runSlot returns the slot of run r while it is with the handler.
func (s *State) runSlot(r uint64) *slot {
	for _, sl := range s.slots {
		if r != 0 && sl.run == r && sl.state == sent {
			return sl
		}
	}
	return nil
}

// endRun applies a run's outcome (actors/funcrun.go endRun): all done, the
// slot finishes (true); else the acked prefix finishes, the first event
// not done becomes the slot's, a new delivery with its own attempts, and
// the events after it go back.
func (s *State) endRun(sl *slot, o RunOutcome, e *Effects) bool {
	sl.run = 0
	if o.Done >= len(sl.batch) {
		s.answer(time.Time{}, sl, Acked, 0, "", o.Committed, e)
		return true
	}
	if o.Done > 0 {
		s.ackPrefix(sl, o.Done, o.Committed, e)
	}
	s.unbatch(sl, e)
	return false
}

// RunAnswered takes a run's answer (actors/funcrun.go onRunAnswer): its
// acked prefix finishes; the event not acked is answered for as a single
// delivery (Next); a run cut short leaves its first event not done
// waiting, uncharged (and, Unsure, the lease found unsure). The answer of
// a run the window ended, or of another, changes nothing.
func (s *State) RunAnswered(now time.Time, o RunOutcome) Effects {
	var e Effects
	sl := s.runSlot(o.Run)
	if sl == nil || (s.ending != nil && s.ending.Run == o.Run) {
		return e
	}
	if sl.to == s.handler && (o.Cut || o.Next != Panicked) {
		s.fails = 0 // the handler answers: replacements start over; a panic, as a single delivery's, does not
	}
	switch {
	case s.endRun(sl, o, &e):
	case o.Cut:
		s.setState(sl, waiting)
		if o.Unsure {
			s.unsure, s.draining, s.checking = true, true, false
		}
	default:
		s.answer(now, sl, o.Next, o.After, o.Reason, false, &e)
	}
	s.settle(&e)
	return e
}

// RunEnded takes the outcome of a run the window asked to end
// ([Effects.EndRun]). Late (actors/funcrun.go timeoutRun): the event in
// hand is timed out, a failed attempt, and gets the handler probed; one
// the handler answered meanwhile takes that answer; one not started
// waits. Replaced (deliver.go replaceHandler): the event in hand goes to
// the successor uncharged; one the handler answered meanwhile takes that
// answer, charged as any; one not started waits. Either way the acked
// prefix finishes first.
func (s *State) RunEnded(now time.Time, o RunOutcome) Effects {
	var e Effects
	end := s.ending
	sl := s.runSlot(o.Run)
	if end == nil || end.Run != o.Run || sl == nil {
		return e
	}
	s.ending = nil
	switch {
	case s.endRun(sl, o, &e):
	case end.Late && o.InHand:
		if s.probe == 0 && s.handler != 0 && sl.to == s.handler {
			s.probes++
			s.probe, s.probeAt = s.probes, now
			s.probeSnd, s.probeSnt = sl.sent, s.runSince
			e.Probe = s.probe
		}
		s.fail(now, sl, 0, fmt.Sprintf("no answer within %v", s.cfg.Timeout), &e)
	case !o.Cut && (end.Late || fault != faultRunAnswerFree):
		s.answer(now, sl, o.Next, o.After, o.Reason, false, &e)
	case o.Cut && !o.InHand:
		s.setState(sl, waiting) // not started
	default:
		sl.attempt++
		if fault != faultFreeNotGiven {
			sl.free++
		}
		s.setState(sl, waiting)
	}
	s.settle(&e)
	return e
}

// unbatch puts the events of a slot's batch after its first back, to the
// front of the pending list, in order.
func (s *State) unbatch(sl *slot, e *Effects) {
	if len(sl.batch) > 1 && fault != faultPutBackLost {
		e.PutBack = append(e.PutBack, sl.batch[1:]...)
	}
	sl.batch = nil
}

// failedWhole: a batch failed as a whole, without saying where (a panic,
// a timeout, a Retry, an answer not a BatchAck): its events after the
// first go back, and the first goes alone next, so that an event that
// breaks its batches is found alone.
func (s *State) failedWhole(sl *slot, e *Effects) {
	if sl.batch == nil {
		return
	}
	if len(sl.batch) > 1 && fault != faultWholeFailureCharged {
		// It says nothing of which event broke it: the attempt is free,
		// and the first event alone is charged for its own.
		sl.free++
	}
	s.unbatch(sl, e)
	sl.alone = true
}

// find returns the slot of delivery id.
func (s *State) find(id uint64) *slot {
	for _, sl := range s.slots {
		if sl.id == id {
			return sl
		}
	}
	return nil
}

// Answered takes a handler's answer. One to an attempt the window no
// longer waits for (timed out, sent again, or of a slot finished)
// changes nothing.
func (s *State) Answered(now time.Time, a Answer) Effects {
	var e Effects
	sl := s.find(a.ID)
	if sl == nil || sl.state != sent || sl.run != 0 || (a.Attempt != sl.attempt && fault != faultAttemptIgnored) {
		return e
	}
	if a.Outcome != Panicked && sl.to == s.handler {
		s.fails = 0 // the handler answers: replacements start over
		s.runs = s.runs || a.Runs
	}
	if sl.batch != nil {
		s.settleBatch(now, sl, a, &e)
	} else {
		s.answer(now, sl, a.Outcome, a.After, a.Reason, a.Committed, &e)
	}
	s.settle(&e)
	return e
}

// answer applies outcome o to a single delivery, or to the first event
// not done of a batch.
func (s *State) answer(now time.Time, sl *slot, o Outcome, after time.Duration, reason string, committed bool, e *Effects) {
	switch o {
	case Acked:
		s.setState(sl, done)
		if committed {
			e.Finished.Committed = max(e.Finished.Committed, sl.last())
		}
	case DeadLettered:
		s.deadLetter(sl, reason, sl.attempt+1, false, e)
	default:
		s.fail(now, sl, after, reason, e)
	}
}

// settleBatch applies a batch's answer (actors/batchdeliver.go
// settleBatch): all done, the slot finishes; else the done prefix is
// finished, the first event not done becomes the slot's, a new delivery
// with its own attempts, the events after it go back, and Next is its
// answer; anything but a BatchAck fails the batch as a whole.
func (s *State) settleBatch(now time.Time, sl *slot, a Answer, e *Effects) {
	n := len(sl.batch)
	switch {
	case a.Outcome != BatchAcked || a.Done < 0 || a.Done > n:
		s.failedWhole(sl, e)
		s.fail(now, sl, a.After, a.Reason, e)
		return
	case a.Done == n:
		s.answer(now, sl, Acked, 0, "", a.Committed, e)
		return
	case a.Done > 0:
		s.ackPrefix(sl, a.Done, a.Committed, e)
		sl.alone = false
	}
	s.unbatch(sl, e)
	s.answer(now, sl, a.Next, a.After, a.Reason, a.NextCommitted, e)
}

// ackPrefix finishes the first done events of sl's batch (committed: their
// checkpoint is written already) and makes the rest its next delivery, a
// first attempt of its head event under a new id. The slot is the
// window's only one (MaxInFlight 1), so the prefix moves over them.
func (s *State) ackPrefix(sl *slot, done int, committed bool, e *Effects) {
	through := sl.batch[done-1].Pos
	e.Finished.Events += done
	e.Finished.Through = max(e.Finished.Through, through)
	if committed {
		e.Finished.Committed = max(e.Finished.Committed, through)
	}
	s.ids++
	stream := sl.ev.Stream
	sl.id, sl.ev, sl.batch = s.ids, sl.batch[done], sl.batch[done:]
	if sl.ev.Stream != stream {
		s.relink()
	}
	if fault != faultHeadKeepsAttempts {
		sl.attempt, sl.free = 0, 0
	}
}

// fail charges a failed attempt: dead-lettered once the budget is spent,
// else retried after the longer of after and the backoff.
func (s *State) fail(now time.Time, sl *slot, after time.Duration, reason string, e *Effects) {
	sl.attempt++
	free := sl.free
	if fault == faultFreeCharged {
		free = 0
	}
	budget := s.cfg.MaxAttempts
	if fault == faultBudgetOverspent {
		budget++
	}
	if sl.attempt-free >= budget {
		s.deadLetter(sl, fmt.Sprintf("retry budget of %d attempts spent; last: %s", s.cfg.MaxAttempts, reason),
			sl.attempt, true, e)
		return
	}
	if s.cfg.Backoff != nil {
		after = max(after, s.cfg.Backoff(sl.attempt))
	}
	s.setState(sl, retrying)
	e.Redeliver = append(e.Redeliver, Redelivery{ID: sl.id, Attempt: sl.attempt, At: now.Add(after)})
}

func (s *State) deadLetter(sl *slot, reason string, attempts int, budget bool, e *Effects) {
	s.setState(sl, deadLettering)
	sl.lstate = letterWriting
	sl.letter = Letter{ID: sl.id, Pos: sl.ev.Pos, Stream: sl.ev.Stream, Reason: reason, Attempts: attempts, Budget: budget}
	e.Letters = append(e.Letters, sl.letter)
}

// Redeliver takes a retry's delay passed: the slot is sent again, after a
// lease check like a first send, once the handler is ready. In a drain it
// changes nothing: the drain sends it at once, or leaves it.
func (s *State) Redeliver(now time.Time, id uint64, attempt int) Effects {
	var e Effects
	sl := s.find(id)
	if sl == nil || sl.state != retrying || sl.attempt != attempt || s.draining {
		return e
	}
	if fault == faultRetryUnchecked && s.ready() {
		s.send(now, sl, nil, &e)
		return e
	}
	s.setState(sl, waiting)
	sl.due = true
	s.settle(&e)
	return e
}

// Tick acts on the clock: a probe unanswered for ProbeWait replaces the
// handler; a delivery unanswered for Timeout counts as a retry and gets
// the handler probed (nothing is sent until it answers).
func (s *State) Tick(now time.Time) Effects {
	var e Effects
	if s.probe != 0 && now.Sub(s.probeAt) >= s.cfg.ProbeWait {
		s.replace(now, &e)
		hung := s.probeSnd
		e.Replace.Hung, e.Replace.SentAt = &hung, s.probeSnt
	}
	for _, sl := range s.slots {
		if sl.state == sent && sl.run != 0 && s.ending == nil && s.runLate(now) {
			s.ending = &EndRun{Run: sl.run, Late: true}
			e.EndRun = s.ending
			e.GivenUp = append(e.GivenUp, GivenUp{ID: sl.id, Attempt: sl.attempt, Late: true})
		}
		if sl.state != sent || sl.run != 0 || now.Sub(sl.sentAt) < s.cfg.Timeout {
			continue
		}
		if fault == faultLateReplaces && s.handler != 0 && sl.to == s.handler {
			s.replace(now, &e)
		}
		if s.probe == 0 && s.handler != 0 && sl.to == s.handler {
			s.probes++
			s.probe, s.probeAt = s.probes, now
			s.probeSnd, s.probeSnt = sl.sent, sl.sentAt
			e.Probe = s.probe
		}
		e.GivenUp = append(e.GivenUp, GivenUp{ID: sl.id, Attempt: sl.attempt, Late: true})
		if fault == faultTimeoutUncharged {
			continue
		}
		s.failedWhole(sl, &e)
		s.fail(now, sl, 0, fmt.Sprintf("no answer within %v", s.cfg.Timeout), &e)
	}
	s.settle(&e)
	return e
}

// ProbeAnswered takes a probe's answer: the handler is alive, and what
// waited for it is sent.
func (s *State) ProbeAnswered(seq uint64) Effects {
	var e Effects
	if seq == 0 || seq != s.probe || fault == faultProbeAnswerIgnored {
		return e
	}
	s.probe = 0
	s.settle(&e)
	return e
}

// HandlerStopped takes handler h's end; the current one is replaced.
func (s *State) HandlerStopped(now time.Time, h uint64) Effects {
	var e Effects
	if h != s.handler || h == 0 || fault == faultStoppedIgnored {
		return e
	}
	s.replace(now, &e)
	s.settle(&e)
	return e
}

// replace gives up on the handler. Its deliveries not yet late go to its
// successor, not charged: the fault was another event's.
func (s *State) replace(now time.Time, e *Effects) {
	old := s.handler
	s.handler, s.probe = 0, 0
	s.fails++
	for _, sl := range s.slots {
		if sl.state == sent && sl.run != 0 && sl.to == old && s.ending == nil && !s.runLate(now) {
			s.ending = &EndRun{Run: sl.run}
			e.EndRun = s.ending
			e.GivenUp = append(e.GivenUp, GivenUp{ID: sl.id, Attempt: sl.attempt})
		}
		if sl.state != sent || sl.run != 0 || sl.to != old || now.Sub(sl.sentAt) >= s.cfg.Timeout {
			continue // answered, or late: Tick charges it
		}
		e.GivenUp = append(e.GivenUp, GivenUp{ID: sl.id, Attempt: sl.attempt})
		s.unbatch(sl, e)
		sl.attempt++
		if fault != faultFreeNotGiven {
			sl.free++
		}
		s.setState(sl, waiting)
	}
	e.Replace = &ReplaceHandler{Old: old, Fails: s.fails}
}

// HandlerSpawned takes the successor's start: what waited is sent to it.
func (s *State) HandlerSpawned() Effects {
	var e Effects
	if s.handler != 0 {
		return e
	}
	s.handlers++
	s.handler = s.handlers
	s.runs = false // until it says it takes them
	s.settle(&e)
	return e
}

// lettering returns id's slot while its dead letter is in state ls, or
// nil (an answer to a letter no longer in that state changes nothing).
func (s *State) lettering(id uint64, ls letterState) *slot {
	sl := s.find(id)
	if sl == nil || sl.state != deadLettering || sl.lstate != ls {
		return nil
	}
	return sl
}

// LetterWritten takes a dead letter written: its slot is finished.
func (s *State) LetterWritten(id uint64) Effects {
	var e Effects
	sl := s.lettering(id, letterWriting)
	if sl == nil {
		return e
	}
	s.setState(sl, done)
	s.settle(&e)
	return e
}

// LetterFailed takes a dead letter's write failed: the slot stays, and
// [State.RewriteLetter] writes it again (or the actor fails).
func (s *State) LetterFailed(id uint64) Effects {
	var e Effects
	sl := s.lettering(id, letterWriting)
	if sl == nil {
		return e
	}
	if fault == faultLetterFailureFinishes {
		s.setState(sl, done)
	} else {
		sl.lstate = letterFailed
	}
	s.settle(&e)
	return e
}

// RewriteLetter writes a failed dead letter again.
func (s *State) RewriteLetter(id uint64) Effects {
	var e Effects
	sl := s.lettering(id, letterFailed)
	if sl == nil {
		return e
	}
	sl.lstate = letterWriting
	e.Letters = append(e.Letters, sl.letter)
	return e
}

// Drain starts a drain: nothing new is taken; among the slots before
// the last one that left the waiting state, the waiting ones go once
// their stream is free and the retrying ones at once, once (the next
// owner would send them at once too); a retrying one answered Retry again
// after that is left, and so is what follows it. The drain ends
// ([Effects.Drained]) when nothing is with the handler or the store and
// nothing more is to be sent — under an unsure lease, nothing is.
func (s *State) Drain() Effects {
	var e Effects
	if s.draining {
		return e
	}
	s.draining = true
	if s.handler == 0 && len(s.sendable()) > 0 {
		e.SpawnNow = true // the drain would wait out the backoff
	}
	s.settle(&e)
	return e
}

// active counts the slots the handler or the store is working on.
func (s *State) active() int {
	n := 0
	for _, sl := range s.slots {
		if sl.state == sent || sl.state == deadLettering {
			n++
		}
	}
	return n
}

// settle ends every input: the finished prefix is dropped and reported,
// a lease check asked if something is to be sent, and a drain's end
// reported.
func (s *State) settle(e *Effects) {
	n := 0
	for _, sl := range s.slots {
		if sl.state != done {
			if fault != faultPrefixSkips {
				break
			}
			continue
		}
		e.Finished.Through = max(e.Finished.Through, sl.last())
		e.Finished.Events += sl.count()
		n++
	}
	if n > 0 {
		e.Finished.Slots += n
		if fault == faultPrefixSkips {
			kept := s.slots[:0]
			for _, sl := range s.slots {
				if sl.state != done {
					kept = append(kept, sl)
				} else {
					s.drop(sl)
				}
			}
			clear(s.slots[len(kept):])
			s.slots = kept
		} else {
			for _, sl := range s.slots[:n] {
				s.drop(sl)
			}
			k := copy(s.slots, s.slots[n:])
			clear(s.slots[k:])
			s.slots = s.slots[:k]
		}
	}
	if s.draining && fault != faultRunNotCut {
		for _, sl := range s.slots {
			if sl.run != 0 && sl.state == sent {
				e.CutRun = true // it answers after the event in hand
			}
		}
	}
	more := len(s.sendable()) > 0
	if more && s.ready() && !s.checking {
		s.checking = true
		e.CheckLease = true
	}
	if s.draining && s.active() == 0 && (!more || fault == faultDrainEndsEarly || (fault == faultDrainEndsUnready && !s.ready())) {
		e.Drained = true
	}
}

// drop takes sl, finished, out of the window, its struct for Take to
// reuse.
func (s *State) drop(sl *slot) {
	s.unlink(sl)
	s.spare = append(s.spare, sl)
}

// Left is the event a window stopped at once (a reader restarted, or
// stopped by its coordinator) leaves its successor at the same epoch to
// send as the retry it is: its first slot, if delivered and not finished.
// One waiting out a retry (or to be sent again) keeps its attempts; one
// with the handler gives its attempt up, not charged — the stop was not
// the event's fault; one whose dead letter is being written leaves the
// letter (Event.Letter), which the successor writes again instead of
// sending the event. The successor takes it with Event.Attempt and
// Event.Free set.
func (s *State) Left() (Event, bool) {
	if len(s.slots) == 0 {
		return Event{}, false
	}
	sl := s.slots[0]
	e := sl.ev
	switch {
	case fault == faultLeftForgotten:
		return Event{}, false
	case sl.state == sent:
		e.Attempt, e.Free = sl.attempt+1, sl.free+1
		if fault == faultLeftCharged {
			e.Free = sl.free
		}
	case sl.attempt > 0 && (sl.state == retrying || sl.state == waiting):
		e.Attempt, e.Free = sl.attempt, sl.free
	case sl.state == deadLettering && fault != faultLeftLetterForgotten:
		l := sl.letter
		e.Attempt, e.Free, e.Letter = sl.attempt, sl.free, &l
	case e.Letter != nil:
		// A letter carried and not written again yet: carried on.
	default:
		return Event{}, false
	}
	return e, true
}

// LeftRun is [State.Left] with a run in flight, ended as the reader stops
// (o is its outcome; actors/reader.go leftRetry, coordinator.go
// handledThrough): done of its events are handled, and the successor
// starts after them; the first not done, in hand or answered, is left
// given up, not charged — at attempt 1 if it followed done events (a
// new delivery's first, given up), else at the run's attempt+1. One not
// started is left at its attempt, free as it was, as a waiting one is:
// nothing, unless it is a retry (the run's first event, attempt above 0).
func (s *State) LeftRun(o RunOutcome) (left Event, ok bool, done int) {
	sl := s.runSlot(o.Run)
	if sl == nil || len(s.slots) != 1 {
		left, ok = s.Left()
		return left, ok, 0
	}
	done = min(o.Done, len(sl.batch))
	if done == len(sl.batch) {
		return Event{}, false, done
	}
	left = sl.batch[done]
	if !o.InHand && o.Cut { // not started
		if done > 0 || sl.attempt == 0 || fault == faultRunLeftForgetsUnstarted {
			return Event{}, false, done // a first attempt: nothing delivered
		}
		left.Attempt, left.Free = sl.attempt, sl.free
		return left, true, done
	}
	if done > 0 && fault != faultRunLeftKeepsAttempts {
		left.Attempt, left.Free = 1, 1
	} else {
		left.Attempt, left.Free = sl.attempt+1, sl.free+1
	}
	return left, true, done
}

// Len is how many slots the window holds.
func (s *State) Len() int { return len(s.slots) }

// First describes the window's first slot, for diagnostics: its state
// ("waiting", "sent", "retrying", "letter"), its attempt and its free
// attempts; ok false if the window is empty.
func (s *State) First() (state string, attempt, free int, ok bool) {
	if len(s.slots) == 0 {
		return "", 0, 0, false
	}
	sl := s.slots[0]
	return sl.state.String(), sl.attempt, sl.free, true
}

// String names a slot state.
func (st slotState) String() string {
	return [...]string{"waiting", "sent", "retrying", "letter", "done"}[st]
}

// String is the window in one line, for diagnostics and the
// simulation's trace.
func (s *State) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "handler %d probe %d fails %d", s.handler, s.probe, s.fails)
	if s.checking {
		b.WriteString(" checking")
	}
	if s.draining {
		b.WriteString(" draining")
	}
	if s.unsure {
		b.WriteString(" unsure")
	}
	b.WriteString(" [")
	for i, sl := range s.slots {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "#%d@%d/%s:%s a%d f%d", sl.id, sl.ev.Pos, sl.ev.Stream, sl.state, sl.attempt, sl.free)
		if sl.state == deadLettering && sl.lstate == letterFailed {
			b.WriteString("!")
		}
		if sl.onDrain {
			b.WriteString("d")
		}
		if len(sl.batch) > 0 {
			fmt.Fprintf(&b, " b%d", len(sl.batch))
		}
		if sl.alone {
			b.WriteString(" alone")
		}
	}
	b.WriteString("]")
	return b.String()
}

// fault re-injects one of the window's past bugs (0: none), for the
// simulation to find; set only by TestSimFindsTheFaults.
var fault faultKind

type faultKind uint8

const (
	faultNone faultKind = iota
	// A retried delivery is sent without a lease check (9fe9fc6).
	faultRetryUnchecked
	// A late delivery replaces a handler that is alive, unprobed
	// (f43cd9d).
	faultLateReplaces
	// Deliveries go to a probed handler (f43cd9d: nothing is sent
	// meanwhile).
	faultSendWhileProbing
	// A stopped handler is not replaced (70b76e4).
	faultStoppedIgnored
	// Deliveries sent again to a replaced handler's successor are charged
	// to their events' budgets (70b76e4).
	faultFreeNotGiven
	// The budget counts the free attempts too (the verdict ignores free).
	faultFreeCharged
	// A batch that failed as a whole is charged to its first event (the
	// actor before TestBatchedDeliveries/ABatchFailedAsAWholeIsChargedToNoEventOfIt).
	faultWholeFailureCharged
	// A drain sends neither the retrying slots nor those waiting behind
	// them (164e52c).
	faultDrainLeavesRetries
	// A drain sends a retrying slot again each time it answers Retry.
	faultDrainResendsForEver
	// An unreadable event is sent to the handler (f128c71).
	faultUnreadableSent
	// An answer is matched by delivery id only, not attempt.
	faultAttemptIgnored
	// A waiting slot is sent while an earlier one of its stream is
	// unfinished.
	faultStreamJump
	// The window takes one event more than MaxInFlight.
	faultOverAdmits
	// The finished prefix counts finished slots past an unfinished one.
	faultPrefixSkips
	// A failed dead-letter write finishes its slot.
	faultLetterFailureFinishes
	// A drain ends with slots it still has to send.
	faultDrainEndsEarly
	// A delivery unanswered past the timeout is not counted as a retry:
	// it waits for ever on a hung handler.
	faultTimeoutUncharged
	// A probe's answer does not resume the handler.
	faultProbeAnswerIgnored
	// A reader stopped at once leaves no retry: its successor at the
	// same epoch sends the event as a first attempt (8de5870, b0fedd3).
	faultLeftForgotten
	// The attempt given up by a reader stopped at once is charged to the
	// event's budget (b0fedd3: the stop was not its fault).
	faultLeftCharged
	// An event is retried once more than its budget.
	faultBudgetOverspent
	// A drain ends while the handler is probed or replaced, leaving what
	// it would send to the handler once ready (actors/deliver.go before
	// TestADrainWhileTheHandlerIsReplacedSendsWhatItMust: sendOnDrain
	// returned, maybeFinishDrain found nothing active).
	faultDrainEndsUnready
	// A reader stopped at once while writing a dead letter leaves
	// nothing: its successor sends the event again from its first
	// attempt (actors/reader.go before
	// TestADeadLetterLeftByARestartedReaderIsWrittenNotDeliveredAgain).
	faultLeftLetterForgotten
	// A retry whose delay passed while the handler was not ready is sent
	// by a drain as a first send, and sent once more when it fails again
	// (actors/deliver.go before
	// TestADrainSendsARetryDueWhileTheHandlerWasAwayOnce).
	faultDueNotOnDrain
	// A batch that failed as a whole is sent whole again: the event that
	// breaks it is never found alone.
	faultNotAlone
	// A batch takes an unreadable pending event in.
	faultBatchTakesUnreadable
	// A run takes one event more than RunEvents.
	faultRunTakesOneMore
	// A drain does not cut the run in flight short.
	faultRunNotCut
	// A reader stopped at once with a run in flight leaves the run's
	// first event at the run's attempts when its prefix is done, not as
	// the new delivery it is.
	faultRunLeftKeepsAttempts
	// A batch takes pending events past Batch.MaxBytes.
	faultBatchBytesIgnored
	// The events of a batch after its first not done are not put back:
	// they are lost to the reader.
	faultPutBackLost
	// The first event not done of a batch acked in part keeps the
	// batch's attempts, not a new delivery's own.
	faultHeadKeepsAttempts
	// A reader stopped at once with a run in flight that had not started
	// its first event, a retry, leaves nothing: its successor sends it as
	// attempt 0, its retry budget whole again (the actor's leftRetry
	// before TestFunctionHandlerRuns/ARetryRunNotStartedWhenItsReaderRestartsKeepsItsAttempts).
	faultRunLeftForgetsUnstarted
	// A run the handler answered (a Retry, a panic) as the window ended
	// it for its handler's replacement is sent to the successor free, its
	// failure not charged (found by the simulation, seed 6793).
	faultRunAnswerFree
)
