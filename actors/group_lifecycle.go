package actors

// A group's lifecycle: making, starting, stopping and aborting it.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"

	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/supervision"
)

// StartGroup starts a subscription group in this process: it is
// [Runtime.NewGroup] then [Group.Start]. Every process that starts a group
// with the same Subscription shares its buckets. The options are validated
// first, each error naming its field. ctx bounds the start only.
func (rt *Runtime) StartGroup(ctx context.Context, opts GroupOptions) (*Group, error) {
	gr, err := rt.NewGroup(opts)
	if err != nil {
		return nil, err
	}
	if err := gr.Start(ctx); err != nil {
		return nil, err
	}
	return gr, nil
}

// NewGroup validates opts, each error naming its field, and returns a
// group of this runtime that is not started: [Group.Start] starts it. A
// group without opts.Worker gets a new random worker id here.
func (rt *Runtime) NewGroup(opts GroupOptions) (*Group, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Worker == "" {
		opts.Worker = uuid.NewString()
	}
	logger := opts.Logger
	if logger == nil {
		logger = rt.logger
	}
	g := &group{
		rt: rt, opts: opts, store: rt.store, logger: logger.With("subscription", opts.Subscription),
		owned: map[int]leasestore.Lease{}, handoff: map[int]bool{}, progress: map[int]int64{},
		queues: map[int]*overflow.Queue{}, done: make(chan struct{}), lags: map[int]bucketLag{},
	}
	return &Group{g: g}, nil
}

// Start joins the subscription's workers (a lease store of its own, on the
// runtime's lease pool: see RuntimeOptions.LeasePoolConns), makes sure its
// lease rows and index exist, and spawns the group's coordinator on the runtime's actor system, which
// claims buckets and runs their readers. The runtime must be running. ctx
// bounds the start only. A second Start does nothing; after Stop it
// returns [kumierr.ErrStopped]; a failed start undoes what it did, and may be tried
// again.
func (gr *Group) Start(ctx context.Context) error { return gr.life.Start(ctx, gr.start) }

func (gr *Group) start(ctx context.Context) error {
	g, rt, opts := gr.g, gr.g.rt, gr.g.opts
	if st := rt.life.State(); st != startstop.Running {
		if st == startstop.New || st == startstop.Starting {
			return errors.New("kumi: start group: the runtime is not started (call Runtime.Start first)")
		}
		return fmt.Errorf("kumi: start group: the runtime is %v: %w", st, startstop.ErrStopped)
	}
	base := opts.Logger // the lease store adds the subscription (and the worker) itself
	if base == nil {
		base = rt.logger
	}
	var sessions *leasestore.Sessions
	var err error
	if opts.Lease.Kind == leasestore.KindSession {
		sessions, err = rt.sessionsFor(opts.Lease.SessionURL)
		if err != nil {
			return reroot(err, "leasestore.Config.", "GroupOptions.Lease.")
		}
	}
	leases, err := leasestore.New(rt.leasePool, leasestore.Config{
		Schema:       rt.store.Schema(),
		Subscription: opts.Subscription,
		Worker:       opts.Worker,
		Buckets:      opts.Buckets,
		LeaseOptions: opts.Lease,
		Logger:       base,
		Notifier:     rt.notifier, // the process's one LISTEN connection
		Batcher:      rt.passes,   // the process's passes share round trips
		Sessions:     sessions,    // KindSession: the process's one session connection (per SessionURL)
	})
	if err == nil {
		err = leases.Start(ctx)
	}
	if err != nil {
		return err
	}
	var unregister func()
	fail := func(err error) error {
		if unregister != nil {
			unregister()
		}
		_ = leases.Stop(context.Background())
		g.leases = nil // not started: see finish
		return err
	}
	if err := leases.EnsureBuckets(ctx); err != nil {
		return fail(err)
	}
	if err := rt.store.EnsureConsumerGroupIndex(ctx, opts.Buckets); err != nil {
		return fail(err)
	}
	g.leases, g.publisher = leases, rt.publisher
	g.interval, g.renewedAt = leases.Config().Heartbeat, time.Now()
	g.life, g.endLife = context.WithCancel(context.Background())
	g.telemetry = rt.telemetry.forGroup(opts.Subscription, leases.Worker())
	unregister = g.telemetry.t.RegisterStatus(g.statusSnapshot)
	if g.handlerSupervisor, err = supervisor.OneForOne(supervisor.Options{Observer: g.observer("handler")}); err != nil {
		return fail(err)
	}
	if g.readerSupervisor, err = supervisor.OneForOne(supervisor.Options{Observer: g.observer("reader")}); err != nil {
		return fail(err)
	}
	coordinatorObserver := supervision.Observers(g.observer("coordinator"), supervision.ObserverFunc(g.coordinatorDecision))
	if g.coordinatorSupervisor, err = supervisor.OneForOne(supervisor.Options{Observer: coordinatorObserver}); err != nil {
		return fail(err)
	}
	props := actor.PropsFromProducer(func() actor.Actor { return &coordinator{g: g} },
		actor.WithSupervisor(g.readerSupervisor), actor.WithGuardian(g.coordinatorSupervisor))
	// Registered under the runtime's lock while it runs, so that a
	// runtime's Stop either sees the group or refuses it.
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if st := rt.life.State(); st != startstop.Running {
		return fail(fmt.Errorf("kumi: start group: the runtime is %v: %w", st, startstop.ErrStopped))
	}
	g.unregister = unregister
	gr.coordinator = rt.system.Root.Spawn(props)
	rt.groups[gr] = struct{}{}
	return nil
}

// Stop stops the group gracefully: each reader finishes its in-flight event
// and flushes its checkpoint, then every lease is released and the worker
// leaves the pool, so other workers take the buckets over at once.
// It is idempotent and safe from several goroutines. If ctx ends first it
// stops the actors without waiting for them, leaves the leases to expire,
// logs what was still running, and returns ctx.Err(). If the group had
// already ended on a failure, Stop returns it (see [Group.Err]). Stop
// before Start closes [Group.Done]; the group then never starts.
func (gr *Group) Stop(ctx context.Context) error {
	err := gr.life.Stop(ctx, gr.halt)
	if gr.life.State() == startstop.Stopped {
		gr.g.finish(nil) // a group never started ends here; a started one has ended already
	}
	return err
}

// halt asks the coordinator to stop and waits for the group to end. A
// second halt (after a first ran out of time) finds it ended.
func (gr *Group) halt(ctx context.Context) error {
	select {
	case <-gr.g.done: // ended already: no coordinator to ask
	default:
		gr.g.rt.system.Root.Send(gr.coordinator, stopGroup{})
	}
	defer gr.forget()
	select {
	case <-gr.g.done:
		return gr.Err()
	case <-ctx.Done():
	}
	// Do not wait: a handler blocked in a call that ignores its context
	// would hold the stop for ever. Its actors end when the call returns.
	gr.g.rt.system.Root.Stop(gr.coordinator)
	if gr.g.finish(ctx.Err()) {
		gr.g.logger.Warn("kumi: group stop: the deadline came before the readers drained; actors left to stop on their own, "+
			"leases left to expire (a handler blocked in a call that ignores its context?)",
			"owned", gr.g.ownedBuckets(), "err", ctx.Err())
	}
	return gr.Err()
}

// abortWait bounds Abort's wait for the group's actors to stop.
const abortWait = time.Second

// Abort stops the group at once, as a crash would: readers stop without
// finishing their in-flight events or flushing checkpoints, and no lease is
// released. Other workers take the buckets over when the leases expire (for
// the session kind, at once: the session closes). Events after the last
// flushed checkpoint are delivered again by the next owner. Abort waits
// briefly for the actors to stop; a handler still blocked after that is
// logged and left running. Use [Group.Stop] for a graceful stop.
func (gr *Group) Abort() {
	ctx, cancel := context.WithTimeout(context.Background(), abortWait)
	defer cancel()
	gr.g.rt.mu.Lock()
	coordinator := gr.coordinator // nil: never started
	gr.g.rt.mu.Unlock()
	if coordinator == nil {
		gr.g.finish(nil)
		return
	}
	if err := stopActor(ctx, gr.g.rt.system, coordinator); err != nil {
		gr.g.logger.Warn("kumi: group abort: actors still running; left to stop on their own", "err", err)
	}
	gr.g.finish(nil)
	gr.forget()
}

// forget removes the group from its runtime's.
func (gr *Group) forget() {
	gr.g.rt.mu.Lock()
	delete(gr.g.rt.groups, gr)
	gr.g.rt.mu.Unlock()
}

// finish ends the group with err (nil for a clean end), once: it reports
// whether this call ended it.
func (g *group) finish(err error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.done:
		return false
	default:
	}
	g.err = err
	if g.leases != nil { // started
		g.endLife()
		g.handlerSupervisor.Close()
		g.readerSupervisor.Close()
		g.coordinatorSupervisor.Close()
		_ = g.leases.Stop(context.Background())
		g.unregister()
	}
	close(g.done)
	return true
}
