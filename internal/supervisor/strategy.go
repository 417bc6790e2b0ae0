package supervisor

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/supervision"
)

// Exhaustion is what a [Strategy] does when a child fails more than
// [Options.MaxRestarts] times within [Options.Window].
type Exhaustion int

const (
	// StopWhenExhausted (the default) stops the failed child — under
	// all-for-one, every child. The supervisor sees *actor.Terminated and
	// decides what to do next (a Coordinator releases the bucket).
	StopWhenExhausted Exhaustion = iota
	// EscalateWhenExhausted hands the failure to the supervisor's own
	// supervisor, which then decides about the supervisor and its children.
	EscalateWhenExhausted
)

// Defaults for [Options]' zero fields.
const (
	MaxRestartsDefault = 10
	WindowDefault      = time.Minute
)

// Options configures a [Strategy]. The zero value is usable: 10 restarts a
// minute, the default [supervision.Backoff], [DefaultDecider], decisions logged at Debug
// to slog.Default, and children stopped once the budget runs out.
type Options struct {
	// MaxRestarts is the retry budget: how many restarts a child may have
	// within Window. The next failure exhausts it. 0 means
	// MaxRestartsDefault; a Decider that never restarts forbids restarts.
	MaxRestarts int
	// Window is the retry budget's sliding window; 0 means WindowDefault.
	// After a Window without failures a child's attempts start again at 1.
	Window time.Duration
	// Backoff delays every restart.
	Backoff supervision.Backoff
	// Decider classifies failures; nil means DefaultDecider.
	Decider Decider
	// Observer receives every decision; nil means LogObserver(nil).
	Observer supervision.Observer
	// Exhausted says what happens when the budget runs out.
	Exhausted Exhaustion
}

// WithDefaults returns o with zero fields replaced by their defaults.
func (o Options) WithDefaults() Options {
	if o.MaxRestarts == 0 {
		o.MaxRestarts = MaxRestartsDefault
	}
	if o.Window == 0 {
		o.Window = WindowDefault
	}
	o.Backoff = o.Backoff.WithDefaults()
	if o.Decider == nil {
		o.Decider = DefaultDecider
	}
	if o.Observer == nil {
		o.Observer = supervision.LogObserver(nil)
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.MaxRestarts < 0:
		return &kumierr.ConfigError{Field: "supervisor.Options.MaxRestarts", Value: o.MaxRestarts, Reason: fmt.Sprintf("is negative: use a positive budget, or 0 for %d", MaxRestartsDefault)}
	case o.Window < 0:
		return &kumierr.ConfigError{Field: "supervisor.Options.Window", Value: o.Window, Reason: fmt.Sprintf("is negative: use a positive duration, or 0 for %v", WindowDefault)}
	case o.Exhausted != StopWhenExhausted && o.Exhausted != EscalateWhenExhausted:
		return &kumierr.ConfigError{Field: "supervisor.Options.Exhausted", Value: int(o.Exhausted), Reason: "use StopWhenExhausted or EscalateWhenExhausted"}
	}
	var ce *kumierr.ConfigError
	if err := o.Backoff.Validate(); errors.As(err, &ce) {
		return &kumierr.ConfigError{Field: "supervisor.Options." + strings.TrimPrefix(ce.Field, "supervision."), Value: ce.Value, Reason: ce.Reason}
	} else if err != nil {
		return err
	}
	return nil
}

// Strategy is a protoactor [actor.SupervisorStrategy] with error classes,
// a retry budget and real exponential backoff. Build one with [OneForOne]
// or [AllForOne] and pass it with actor.WithSupervisor (for the children
// of an actor) or actor.WithGuardian (for a top-level actor). One Strategy
// may supervise many actors.
//
// A restart waits its backoff delay on a timer, not in the supervisor's
// mailbox; the failed child stays suspended meanwhile (its mailbox keeps
// queuing, its system messages still run, so it can be stopped). A timer
// that fires after the actor system was shut down, or after its children
// stopped, does nothing; [Strategy.Close] cancels the timers still pending.
type Strategy struct {
	allForOne bool
	name      string
	opts      Options

	mu      sync.Mutex
	closed  bool
	pending map[*pendingRestart]struct{}
	// all-for-one: the restart pending per supervisor, so that siblings
	// failing while it waits join it instead of restarting everyone again.
	pendingAll map[actor.Supervisor]*pendingRestart
	// failing holds the children with a failure and no success since
	// (Succeeded), with the time of their last failure; nFailing is its
	// size, which Succeeded reads without the lock.
	failing  map[childKey]time.Time
	nFailing atomic.Int32
}

type pendingRestart struct {
	timer   *time.Timer
	system  *actor.ActorSystem
	sup     actor.Supervisor
	targets []*actor.PID // guarded by Strategy.mu while pending
	at      time.Time
}

var _ actor.SupervisorStrategy = (*Strategy)(nil)

// OneForOne returns a strategy that applies each decision to the failed
// child alone: for children that can fail in isolation, such as a
// Coordinator's BucketReaders. It fails, naming the field, on invalid
// options.
func OneForOne(opts Options) (*Strategy, error) { return newStrategy(false, opts) }

// AllForOne returns a strategy that restarts or stops every child of the
// supervisor when one fails: for children that depend on each other. The
// retry budget is the failed child's. It fails, naming the field, on
// invalid options.
func AllForOne(opts Options) (*Strategy, error) { return newStrategy(true, opts) }

func newStrategy(allForOne bool, opts Options) (*Strategy, error) {
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Strategy{
		allForOne:  allForOne,
		name:       "one_for_one",
		opts:       opts,
		pending:    make(map[*pendingRestart]struct{}),
		pendingAll: make(map[actor.Supervisor]*pendingRestart),
		failing:    make(map[childKey]time.Time),
	}
	if allForOne {
		s.name = "all_for_one"
	}
	return s, nil
}

// errClosed is why a closed strategy stops instead of restarting.
var errClosed = errors.New("supervision: strategy closed")

// HandleFailure implements [actor.SupervisorStrategy]. protoactor calls it
// on the supervisor's goroutine with the failed child's restart statistics
// and the value it panicked with.
func (s *Strategy) HandleFailure(system *actor.ActorSystem, sup actor.Supervisor, child *actor.PID,
	rs *actor.RestartStatistics, reason any, message any,
) {
	if rs == nil { // protoactor always passes them; a direct caller might not
		rs = actor.NewRestartStatistics()
	}
	// Decide: class, directive, budget, delay.
	class, directive := s.opts.Decider(reason)
	d := supervision.Decision{
		Strategy:  s.name,
		Child:     child.String(),
		Class:     class,
		Directive: directive,
		Reason:    ReasonError(reason),
		Time:      time.Now(),
	}
	self, isActor := sup.(interface{ Self() *actor.PID })
	if isActor {
		d.Supervisor = self.Self().String()
	}

	if directive == actor.RestartDirective {
		var exhausted bool
		d.Attempt, exhausted = s.count(child, rs, d.Time)
		if exhausted {
			d.Exhausted = true
			d.Directive = actor.StopDirective
			if s.opts.Exhausted == EscalateWhenExhausted {
				d.Directive = actor.EscalateDirective
			}
		} else {
			d.Delay = s.opts.Backoff.Next(d.Attempt)
		}
	}
	if d.Directive == actor.EscalateDirective && !isActor {
		d.Directive = actor.StopDirective // a guardian has nobody to escalate to
	}

	// Whom the directive applies to, and how a restart happens.
	var targets []*actor.PID
	switch d.Directive {
	case actor.ResumeDirective:
		targets = []*actor.PID{child}
	case actor.RestartDirective, actor.StopDirective:
		targets = s.targets(sup, child, isActor)
	}
	for _, pid := range targets {
		d.Targets = append(d.Targets, pid.String())
	}

	var pending *pendingRestart
	var plan restartPlan
	if d.Directive == actor.RestartDirective {
		var wait time.Duration
		pending, plan, wait = s.plan(system, sup, child, targets, d.Delay)
		switch plan {
		case restartJoined:
			d.Delay = wait
		case restartClosed:
			d.Directive = actor.StopDirective
			d.Reason = errors.Join(d.Reason, errClosed)
		}
	}

	// Report, then act.
	s.opts.Observer.Observe(d)
	system.EventStream.Publish(&actor.SupervisorEvent{Child: child, Reason: reason, Directive: d.Directive})

	switch d.Directive {
	case actor.ResumeDirective:
		sup.ResumeChildren(child)
	case actor.RestartDirective:
		switch plan {
		case restartNow:
			sup.RestartChildren(targets...)
		case restartLater:
			s.start(pending, d.Delay)
		}
	case actor.StopDirective:
		sup.StopChildren(targets...)
	case actor.EscalateDirective:
		sup.EscalateFailure(reason, message)
	}
}

// count records a failure and returns the attempt number and whether the
// budget is exhausted. A success since the last failure (Succeeded) or a
// quiet window forgets old failures, which also keeps the statistics from
// growing without bound.
func (s *Strategy) count(child *actor.PID, rs *actor.RestartStatistics, now time.Time) (attempt int, exhausted bool) {
	if !s.failedBefore(child, now) || rs.NumberOfFailures(s.opts.Window) == 0 {
		rs.Reset()
	}
	rs.Fail()
	attempt = rs.NumberOfFailures(s.opts.Window)
	if attempt > s.opts.MaxRestarts {
		rs.Reset()
		return attempt, true
	}
	return attempt, false
}

// targets returns the children a Restart or Stop applies to. It runs on the
// supervisor's goroutine, the only place Children may be read. A guardian
// does not know its children: it acts on the failed child alone.
func (s *Strategy) targets(sup actor.Supervisor, child *actor.PID, isActor bool) []*actor.PID {
	if !s.allForOne || !isActor {
		return []*actor.PID{child}
	}
	return sup.Children()
}

type restartPlan int

const (
	restartNow    restartPlan = iota // no delay
	restartLater                     // on a timer, armed by start
	restartJoined                    // all-for-one: a restart of every child is already pending
	restartClosed                    // the strategy is closed: stop instead
)

// plan decides how a restart happens. For restartLater it registers the
// pending restart, which start arms once the decision has been observed;
// for restartJoined it adds child to the pending restart and returns the
// time left before it fires.
func (s *Strategy) plan(system *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, targets []*actor.PID,
	delay time.Duration,
) (*pendingRestart, restartPlan, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, restartClosed, 0
	}
	if p, ok := s.pendingAll[sup]; ok {
		if !slices.ContainsFunc(p.targets, child.Equal) { // spawned after the restart was planned
			p.targets = append(p.targets, child)
		}
		return nil, restartJoined, max(0, time.Until(p.at))
	}
	if delay <= 0 {
		return nil, restartNow, 0
	}
	p := &pendingRestart{system: system, sup: sup, targets: targets, at: time.Now().Add(delay)}
	s.pending[p] = struct{}{}
	if s.allForOne {
		s.pendingAll[sup] = p
	}
	return p, restartLater, delay
}

func (s *Strategy) start(p *pendingRestart, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.pending[p]; ok { // not closed meanwhile
		p.timer = time.AfterFunc(delay, func() { s.fire(p) })
	}
}

// fire restarts the targets of p that still exist, unless the actor system
// has been shut down.
func (s *Strategy) fire(p *pendingRestart) {
	s.mu.Lock()
	_, ok := s.pending[p]
	s.forget(p)
	targets := p.targets
	s.mu.Unlock()
	if !ok || p.system.IsStopped() {
		return
	}
	alive := make([]*actor.PID, 0, len(targets))
	for _, pid := range targets {
		if _, ok := p.system.ProcessRegistry.Get(pid); ok {
			alive = append(alive, pid)
		}
	}
	if len(alive) > 0 {
		p.sup.RestartChildren(alive...)
	}
}

// forget removes p; s.mu is held.
func (s *Strategy) forget(p *pendingRestart) {
	delete(s.pending, p)
	if s.pendingAll[p.sup] == p {
		delete(s.pendingAll, p.sup)
	}
}

// Succeeded reports that child handled a message: its next failure is
// counted as its first again, so its restart waits the first backoff delay
// and its budget starts over. Without it a child that fails now and then
// but works in between — a handler that panics on some events and handles
// the rest — would wait longer and longer restarts, up to Backoff.Max, and
// run out of budget within a Window of mostly successes. Call it from the
// child (a receiver middleware, after the message returned without a
// panic); it costs an atomic load while no child of the strategy has
// failed within the last Window.
func (s *Strategy) Succeeded(child *actor.PID) {
	if child == nil || s.nFailing.Load() == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.failing, keyOf(child))
	s.nFailing.Store(int32(len(s.failing)))
}

// childKey identifies a child across its restarts (which keep its PID).
type childKey struct{ address, id string }

func keyOf(pid *actor.PID) childKey { return childKey{pid.Address, pid.Id} }

// failedBefore records a failure of child at now and reports whether the
// child had failed before without a success since (see Succeeded).
// Children that have not failed for a Window are forgotten: stopped ones,
// and quiet ones, whose statistics count nothing older anyway.
func (s *Strategy) failedBefore(child *actor.PID, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, at := range s.failing {
		if now.Sub(at) > s.opts.Window {
			delete(s.failing, k)
		}
	}
	k := keyOf(child)
	_, before := s.failing[k]
	s.failing[k] = now
	s.nFailing.Store(int32(len(s.failing)))
	return before
}

// Pending returns the number of restarts waiting for their backoff delay.
func (s *Strategy) Pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// Close cancels every pending restart — the children stay suspended until
// they are stopped, as they are when their supervisor or the system stops —
// and makes later restart decisions stop the child instead (the decision
// then reports Stop). Close is idempotent; call it when the actors the
// strategy supervises are being shut down.
func (s *Strategy) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for p := range s.pending {
		if p.timer != nil {
			p.timer.Stop()
		}
		s.forget(p)
	}
}
