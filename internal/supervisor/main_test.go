package supervisor

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/internal/leaktest"
	"github.com/kumi-run/kumi/supervision"
)

func TestMain(m *testing.M) { leaktest.VerifyTestMain(m) }

// waitTimeout bounds every wait in these tests; nothing sleeps to let
// things happen.
const waitTimeout = 10 * time.Second

func recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

func newSystem(t testing.TB) *actor.ActorSystem {
	t.Helper()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger {
		return slog.New(slog.DiscardHandler) // protoactor logs every recovery at Info
	}))
	t.Cleanup(func() {
		if !sys.IsStopped() { // Shutdown panics when called twice
			sys.Shutdown()
		}
	})
	return sys
}

// event is what the actors of a tree report.
type event struct {
	kind        string // started, stopped, terminated (seen by the parent), pong
	name        string // c0, c1, ... or parent
	pid         *actor.PID
	incarnation int
}

// fail makes a child panic with err.
type fail struct{ err error }

type ping struct{}

// succeed makes a child report a success to the strategy (Succeeded).
type succeed struct{}

// escalation is a failure that reached the grandparent.
type escalation struct {
	who    *actor.PID
	reason any
}

// tree is grandparent → parent (supervised by the strategy under test) →
// children c0..cN-1. The grandparent records what is escalated to it and
// stops the parent.
type tree struct {
	sys       *actor.ActorSystem
	events    chan event
	decisions chan supervision.Decision
	escalated chan escalation
	gp        *actor.PID
	parent    *actor.PID
	children  []*actor.PID
	strategy  *Strategy

	mu           sync.Mutex
	incarnations map[string]int
}

func newTree(t *testing.T, newStrategy func(Options) (*Strategy, error), opts Options, n int) (*tree, *Strategy) {
	t.Helper()
	tr := &tree{
		sys:          newSystem(t),
		events:       make(chan event, 256),
		decisions:    make(chan supervision.Decision, 256),
		escalated:    make(chan escalation, 16),
		incarnations: make(map[string]int),
	}
	opts.Observer = supervision.Observers(opts.Observer, supervision.ObserverFunc(func(d supervision.Decision) { tr.decisions <- d }))
	s, err := newStrategy(opts)
	if err != nil {
		t.Fatal(err)
	}
	tr.strategy = s

	parent := actor.PropsFromFunc(func(ctx actor.Context) {
		switch msg := ctx.Message().(type) {
		case *actor.Started:
			for i := range n {
				name := fmt.Sprintf("c%d", i)
				if _, err := ctx.SpawnNamed(tr.childProps(name), name); err != nil {
					panic(err)
				}
			}
			tr.events <- event{kind: "started", name: "parent", pid: ctx.Self()}
		case *actor.Terminated:
			tr.events <- event{kind: "terminated", name: msg.Who.Id[strings.LastIndexByte(msg.Who.Id, '/')+1:], pid: msg.Who}
		case ping:
			tr.events <- event{kind: "pong", name: "parent"}
		}
	}, actor.WithSupervisor(s))
	recorder := strategyFunc(func(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, _ any) {
		tr.escalated <- escalation{who: child, reason: reason}
		sup.StopChildren(child)
	})
	tr.gp = tr.sys.Root.Spawn(actor.PropsFromFunc(func(ctx actor.Context) {
		if _, ok := ctx.Message().(*actor.Started); ok {
			if _, err := ctx.SpawnNamed(parent, "parent"); err != nil {
				panic(err)
			}
		}
	}, actor.WithSupervisor(recorder)))
	t.Cleanup(func() {
		if err := tr.sys.Root.StopFuture(tr.gp).Wait(); err != nil {
			t.Errorf("stop: %v", err)
		}
	})

	started := map[string]*actor.PID{}
	for len(started) < n+1 {
		e := recv(t, tr.events, "the tree to start")
		if e.kind != "started" {
			t.Fatalf("unexpected %+v", e)
		}
		started[e.name] = e.pid
	}
	tr.parent = started["parent"]
	for i := range n {
		tr.children = append(tr.children, started[fmt.Sprintf("c%d", i)])
	}
	return tr, s
}

type child struct {
	name   string
	tr     *tree
	incarn int
}

func (tr *tree) childProps(name string) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		tr.incarnations[name]++
		return &child{name: name, tr: tr, incarn: tr.incarnations[name]}
	})
}

func (c *child) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		c.tr.events <- event{kind: "started", name: c.name, pid: ctx.Self(), incarnation: c.incarn}
	case *actor.Stopped:
		c.tr.events <- event{kind: "stopped", name: c.name, pid: ctx.Self(), incarnation: c.incarn}
	case fail:
		panic(msg.err)
	case succeed:
		c.tr.strategy.Succeeded(ctx.Self())
		c.tr.events <- event{kind: "succeeded", name: c.name, pid: ctx.Self(), incarnation: c.incarn}
	}
}

// fail makes child i panic with err.
func (tr *tree) fail(i int, err error) { tr.sys.Root.Send(tr.children[i], fail{err}) }

// succeed makes child i report a success.
func (tr *tree) succeed(i int) { tr.sys.Root.Send(tr.children[i], succeed{}) }

// waitEvent reads events until one of kind about name arrives.
func (tr *tree) waitEvent(t *testing.T, kind, name string) event {
	t.Helper()
	for {
		e := recv(t, tr.events, kind+" "+name)
		if e.kind == kind && e.name == name {
			return e
		}
	}
}

// waitEvents reads events until one of kind about each of names has
// arrived, in any order.
func (tr *tree) waitEvents(t *testing.T, kind string, names ...string) {
	t.Helper()
	missing := map[string]bool{}
	for _, n := range names {
		missing[n] = true
	}
	for len(missing) > 0 {
		if e := recv(t, tr.events, kind+" "+strings.Join(names, ", ")); e.kind == kind {
			delete(missing, e.name)
		}
	}
}

type strategyFunc func(*actor.ActorSystem, actor.Supervisor, *actor.PID, *actor.RestartStatistics, any, any)

func (f strategyFunc) HandleFailure(sys *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, rs *actor.RestartStatistics, reason, msg any) {
	f(sys, sup, child, rs, reason, msg)
}
