package supervisor

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/supervision"
)

var (
	errTransient = &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
	errFence     = fmt.Errorf("checkpoint bucket 3: %w", eventsource.ErrFenceLost)
	errConfig    = &kumierr.ConfigError{Field: "actors.GroupOptions.Buckets", Value: 0, Reason: "must be at least 1"}
)

// fast restarts in a millisecond or two, without jitter, so delays can be
// checked exactly.
var fast = supervision.Backoff{Initial: time.Millisecond, Max: time.Second, Jitter: supervision.NoJitter}

func checkDecision(t *testing.T, d supervision.Decision, class supervision.Class, directive actor.Directive, attempt int) {
	t.Helper()
	if d.Class != class || d.Directive != directive || d.Attempt != attempt {
		t.Fatalf("decision %v/%v attempt %d, want %v/%v attempt %d (%+v)",
			d.Class, d.Directive, d.Attempt, class, directive, attempt, d)
	}
}

func TestOneForOne(t *testing.T) {
	t.Parallel()

	t.Run("RestartsATransientFailureWithGrowingDelays", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, OneForOne, Options{Backoff: fast}, 2)
		var last time.Duration
		for attempt := 1; attempt <= 4; attempt++ {
			failed := time.Now()
			tr.fail(0, errTransient)
			d := recv(t, tr.decisions, "a decision")
			checkDecision(t, d, supervision.Transient, actor.RestartDirective, attempt)
			if want := time.Millisecond << (attempt - 1); d.Delay != want || d.Delay <= last {
				t.Fatalf("attempt %d waits %v, want %v", attempt, d.Delay, want)
			}
			last = d.Delay
			if d.Child != tr.children[0].String() || d.Supervisor != tr.parent.String() || d.Strategy != "one_for_one" ||
				len(d.Targets) != 1 || !errors.Is(d.Reason, errTransient) {
				t.Fatalf("decision %+v", d)
			}
			e := tr.waitEvent(t, "started", "c0")
			if e.incarnation != attempt+1 {
				t.Fatalf("incarnation %d after attempt %d", e.incarnation, attempt)
			}
			if waited := time.Since(failed); waited < d.Delay {
				t.Fatalf("restarted after %v, before its delay %v", waited, d.Delay)
			}
		}
		tr.mu.Lock()
		defer tr.mu.Unlock()
		if tr.incarnations["c1"] != 1 {
			t.Fatal("one-for-one restarted a sibling")
		}
	})

	t.Run("ASuccessStartsTheBackoffAndTheBudgetOver", func(t *testing.T) {
		t.Parallel()
		// A child that fails once per message it handles, and handles the
		// message on its retry, must not see its restart delay grow from
		// message to message, nor its budget run out.
		tr, _ := newTree(t, OneForOne, Options{Backoff: fast, MaxRestarts: 2}, 2)
		for round := 1; round <= 4; round++ {
			tr.fail(0, errTransient)
			d := recv(t, tr.decisions, "a decision")
			checkDecision(t, d, supervision.Transient, actor.RestartDirective, 1)
			if d.Delay != fast.Initial {
				t.Fatalf("round %d waits %v, want the first delay, %v", round, d.Delay, fast.Initial)
			}
			tr.waitEvent(t, "started", "c0")
			tr.succeed(0)
			tr.waitEvent(t, "succeeded", "c0")
		}
		// Another child's success does not reset c1's count.
		for attempt := 1; attempt <= 2; attempt++ {
			tr.fail(1, errTransient)
			checkDecision(t, recv(t, tr.decisions, "a decision"), supervision.Transient, actor.RestartDirective, attempt)
			tr.waitEvent(t, "started", "c1")
			tr.succeed(0)
			tr.waitEvent(t, "succeeded", "c0")
		}
	})

	t.Run("StopsOnALostFence", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, OneForOne, Options{Backoff: fast}, 2)
		tr.fail(1, errFence)
		checkDecision(t, recv(t, tr.decisions, "a decision"), supervision.FenceLost, actor.StopDirective, 0)
		tr.waitEvent(t, "stopped", "c1")
		tr.waitEvent(t, "terminated", "c1")
	})

	t.Run("EscalatesAConfigError", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, OneForOne, Options{Backoff: fast}, 1)
		tr.fail(0, errConfig)
		d := recv(t, tr.decisions, "a decision")
		checkDecision(t, d, supervision.Config, actor.EscalateDirective, 0)
		if len(d.Targets) != 0 {
			t.Fatalf("targets %v", d.Targets)
		}
		esc := recv(t, tr.escalated, "the escalation")
		var ce *kumierr.ConfigError
		if !esc.who.Equal(tr.parent) || !errors.As(ReasonError(esc.reason), &ce) {
			t.Fatalf("escalated %+v", esc)
		}
		tr.waitEvent(t, "stopped", "c0") // the grandparent stopped the parent
	})

	t.Run("StopsWhenTheBudgetIsExhausted", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, OneForOne, Options{Backoff: fast, MaxRestarts: 2}, 1)
		for attempt := 1; attempt <= 2; attempt++ {
			tr.fail(0, errTransient)
			checkDecision(t, recv(t, tr.decisions, "a decision"), supervision.Transient, actor.RestartDirective, attempt)
			tr.waitEvent(t, "started", "c0")
		}
		tr.fail(0, errors.New("something else"))
		d := recv(t, tr.decisions, "the last decision")
		checkDecision(t, d, supervision.Unknown, actor.StopDirective, 3)
		if !d.Exhausted || d.Delay != 0 {
			t.Fatalf("decision %+v", d)
		}
		tr.waitEvent(t, "terminated", "c0")
	})

	t.Run("EscalatesWhenTheBudgetIsExhausted", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, OneForOne, Options{Backoff: fast, MaxRestarts: 1, Exhausted: EscalateWhenExhausted}, 1)
		tr.fail(0, errTransient)
		recv(t, tr.decisions, "a decision")
		tr.waitEvent(t, "started", "c0")
		tr.fail(0, errTransient)
		d := recv(t, tr.decisions, "the last decision")
		checkDecision(t, d, supervision.Transient, actor.EscalateDirective, 2)
		if esc := recv(t, tr.escalated, "the escalation"); !esc.who.Equal(tr.parent) {
			t.Fatalf("escalated %+v", esc)
		}
	})

	t.Run("KeepsTheSupervisorResponsiveWhileARestartWaits", func(t *testing.T) {
		t.Parallel()
		tr, s := newTree(t, OneForOne, Options{Backoff: supervision.Backoff{Initial: time.Hour, Jitter: supervision.NoJitter}}, 2)
		tr.fail(0, errTransient)
		if d := recv(t, tr.decisions, "a decision"); d.Delay != time.Hour {
			t.Fatalf("delay %v", d.Delay)
		}
		tr.sys.Root.Send(tr.parent, ping{})
		tr.waitEvent(t, "pong", "parent")
		if s.Pending() != 1 {
			t.Fatalf("pending %d", s.Pending())
		}

		s.Close()
		s.Close()
		if s.Pending() != 0 {
			t.Fatalf("pending %d after Close", s.Pending())
		}
		tr.fail(1, errTransient)
		d := recv(t, tr.decisions, "a decision after Close")
		if d.Directive != actor.StopDirective || !errors.Is(d.Reason, errClosed) || !errors.Is(d.Reason, errTransient) {
			t.Fatalf("decision after Close %+v", d)
		}
		tr.waitEvent(t, "terminated", "c1")
	})

	t.Run("SupervisesATopLevelActorAsGuardian", func(t *testing.T) {
		t.Parallel()
		sys := newSystem(t)
		decisions := make(chan supervision.Decision, 8)
		started := make(chan int, 8)
		s, err := OneForOne(Options{Backoff: fast, Observer: supervision.ObserverFunc(func(d supervision.Decision) { decisions <- d })})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		pid := sys.Root.Spawn(actor.PropsFromProducer(func() actor.Actor {
			n++
			incarnation := n
			return actor.ReceiveFunc(func(ctx actor.Context) {
				switch msg := ctx.Message().(type) {
				case *actor.Started:
					started <- incarnation
				case fail:
					panic(msg.err)
				}
			})
		}, actor.WithGuardian(s)))
		recv(t, started, "the start")
		sys.Root.Send(pid, fail{errTransient})
		d := recv(t, decisions, "a decision")
		checkDecision(t, d, supervision.Transient, actor.RestartDirective, 1)
		if d.Supervisor != "" {
			t.Fatalf("supervisor %q", d.Supervisor)
		}
		if got := recv(t, started, "the restart"); got != 2 {
			t.Fatalf("incarnation %d", got)
		}
		stopped := sys.Root.StopFuture(pid) // a guardian cannot escalate: the actor stops
		sys.Root.Send(pid, fail{errConfig})
		if err := stopped.Wait(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestAllForOne(t *testing.T) {
	t.Parallel()

	t.Run("RestartsEverySibling", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, AllForOne, Options{Backoff: fast}, 3)
		tr.fail(1, errTransient)
		d := recv(t, tr.decisions, "a decision")
		checkDecision(t, d, supervision.Transient, actor.RestartDirective, 1)
		if len(d.Targets) != 3 || d.Strategy != "all_for_one" {
			t.Fatalf("decision %+v", d)
		}
		restarted := map[string]bool{}
		for len(restarted) < 3 {
			if e := recv(t, tr.events, "the restarts"); e.kind == "started" && e.incarnation == 2 {
				restarted[e.name] = true
			}
		}
	})

	t.Run("StopsEverySiblingOnALostFence", func(t *testing.T) {
		t.Parallel()
		tr, _ := newTree(t, AllForOne, Options{Backoff: fast}, 3)
		tr.fail(2, errFence)
		checkDecision(t, recv(t, tr.decisions, "a decision"), supervision.FenceLost, actor.StopDirective, 0)
		tr.waitEvents(t, "terminated", "c0", "c1", "c2")
	})

	t.Run("SiblingsFailingDuringTheDelayJoinOneRestart", func(t *testing.T) {
		t.Parallel()
		tr, s := newTree(t, AllForOne, Options{Backoff: supervision.Backoff{Initial: time.Hour, Jitter: supervision.NoJitter}}, 2)
		tr.fail(0, errTransient)
		first := recv(t, tr.decisions, "a decision")
		tr.fail(1, errTransient)
		second := recv(t, tr.decisions, "a second decision")
		if second.Directive != actor.RestartDirective || second.Delay > first.Delay || s.Pending() != 1 {
			t.Fatalf("decisions %+v, %+v; pending %d", first, second, s.Pending())
		}
		s.Close()
	})
}

func TestOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		opts  Options
		field string
	}{
		{Options{MaxRestarts: -1}, "supervisor.Options.MaxRestarts"},
		{Options{Window: -time.Second}, "supervisor.Options.Window"},
		{Options{Exhausted: 5}, "supervisor.Options.Exhausted"},
		{Options{Backoff: supervision.Backoff{Multiplier: 0.5}}, "supervisor.Options.Backoff.Multiplier"},
	} {
		_, err := OneForOne(tc.opts)
		var ce *kumierr.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || supervision.Classify(err) != supervision.Config {
			t.Errorf("OneForOne(%+v) = %v, want a ConfigError naming %s", tc.opts, err, tc.field)
		}
	}
	o := Options{}.WithDefaults()
	if o.MaxRestarts != MaxRestartsDefault || o.Window != WindowDefault || o.Decider == nil || o.Observer == nil || o.Backoff.Initial != supervision.InitialDefault {
		t.Errorf("defaults %+v", o)
	}
}

// fakeSupervisor records what a strategy asks of it.
type fakeSupervisor struct{ restarted []*actor.PID }

func (f *fakeSupervisor) Children() []*actor.PID   { return nil }
func (f *fakeSupervisor) EscalateFailure(any, any) {}
func (f *fakeSupervisor) RestartChildren(pids ...*actor.PID) {
	f.restarted = append(f.restarted, pids...)
}
func (f *fakeSupervisor) StopChildren(...*actor.PID)   {}
func (f *fakeSupervisor) ResumeChildren(...*actor.PID) {}

func TestLateRestartsDoNothing(t *testing.T) {
	t.Parallel()
	s, err := OneForOne(Options{})
	if err != nil {
		t.Fatal(err)
	}
	sys := newSystem(t)
	sup := &fakeSupervisor{}
	started := make(chan struct{})
	alive := sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*actor.Started); ok {
			close(started)
		}
	}))
	recv(t, started, "the start")
	dead := sys.NewLocalPID("gone")

	plan := func() *pendingRestart {
		p, how, _ := s.plan(sys, sup, alive, []*actor.PID{alive, dead}, time.Hour)
		if how != restartLater {
			t.Fatalf("plan %v", how)
		}
		return p
	}
	s.fire(plan())
	if len(sup.restarted) != 1 || !sup.restarted[0].Equal(alive) {
		t.Fatalf("restarted %v, want only the live child", sup.restarted)
	}
	if err := sys.Root.StopFuture(alive).Wait(); err != nil {
		t.Fatal(err)
	}
	p := plan()
	sys.Shutdown()
	s.fire(p)
	if len(sup.restarted) != 1 || s.Pending() != 0 {
		t.Fatalf("restarted %v after shutdown, pending %d", sup.restarted, s.Pending())
	}
}
