package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// Group is one subscription group running in this process: a Coordinator
// actor and a BucketReader per owned bucket. Its Start and Stop follow
// kumi's lifecycle contract (docs/design/architecture.md, "Lifecycle"):
// [Runtime.NewGroup] makes one, [Group.Start] starts it, and
// [Runtime.StartGroup] does both. It runs until [Group.Stop], or until it
// ends on its own (see [Group.Done]).
type Group struct {
	g           *group
	coordinator *actor.PID // set by Start
	life        startstop.Lifecycle
}

// group is what a group's actors share.
type group struct {
	rt     *Runtime
	opts   GroupOptions
	store  *eventsource.Store
	leases *leasestore.Store
	// life bounds every lease-store call of the group; finish ends it, so
	// that no call in flight holds up the runtime's lease pool's Close.
	life              context.Context
	endLife           context.CancelFunc
	publisher         *actor.PID
	logger            *slog.Logger
	telemetry         *telemetry
	handlerSupervisor *supervision.Strategy
	answerWarned      sync.Map // answerWarning → struct{}: handler contract warnings given (deliver.go)
	readerSupervisor  *supervision.Strategy
	// coordinatorSupervisor restarts a failed coordinator (its readers
	// stop with it; the restarted one reclaims and respawns, its readers
	// starting after what theirs handled at the same epochs: see marks).
	coordinatorSupervisor *supervision.Strategy
	// marks is what the slots' readers handled, by slot and epoch: it
	// outlives the coordinator's incarnations (see handledMarks).
	marks    handledMarks
	interval time.Duration

	mu          sync.Mutex
	owned       map[int]leasestore.Lease
	handoff     map[int]bool
	progress    map[int]int64
	lags        map[int]bucketLag
	lagAt       time.Time
	liveWorkers int
	queues      map[int]*overflow.Queue
	done        chan struct{}
	err         error
	// failure is why the coordinator's guardian stopped it, if it did.
	failure *GroupFailedError
	// renewedAt is when the last successful lease pass started (the
	// group's start before the first); passErr the error of the last
	// pass, nil once one succeeds.
	renewedAt  time.Time
	passErr    error
	unregister func()
	// dropped counts the pauses and overflows of the readers' queues,
	// each of which dropped what its queue held (re-read from the store);
	// kumi.queue.dropped counts the batches.
	dropped atomic.Int64
	// readerStates holds the readers' states other than reading (see
	// setReaderState), guarded by mu.
	readerStates map[int]string
	// reports holds what each slot's reader last reported of itself (see
	// reader.report), guarded by mu.
	reports map[int]readerReport
	// resize is the subscription's generation and resize as the last pass
	// read them, guarded by mu.
	resize leasestore.Resize
}

// setResize records the resize the last pass read.
func (g *group) setResize(r leasestore.Resize) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.resize = r
}

// queueTransition counts and reports a reader queue's pause or overflow.
func (g *group) queueTransition(bucket int) func(overflow.Transition) {
	report := g.telemetry.queueTransition(bucket, g.opts.Overflow)
	return func(tr overflow.Transition) {
		if tr.To != overflow.Active {
			g.dropped.Add(1)
		}
		report(tr)
	}
}

// bucketLag is a bucket's backlog as measured after a pass.
type bucketLag struct {
	checkpoint int64
	events     int64
	oldest     time.Time
}

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
// returns [ErrStopped]; a failed start undoes what it did, and may be tried
// again.
func (gr *Group) Start(ctx context.Context) error { return gr.life.Start(ctx, gr.start) }

func (gr *Group) start(ctx context.Context) error {
	g, rt, opts := gr.g, gr.g.rt, gr.g.opts
	if st := rt.life.State(); st != startstop.Running {
		if st == startstop.New || st == startstop.Starting {
			return errors.New("kumi: start group: the runtime is not started (call Runtime.Start first)")
		}
		return fmt.Errorf("kumi: start group: the runtime is %v: %w", st, ErrStopped)
	}
	base := opts.Logger // the lease store adds the subscription (and the worker) itself
	if base == nil {
		base = rt.logger
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
	if g.handlerSupervisor, err = supervision.OneForOne(supervision.Options{Observer: g.observer("handler")}); err != nil {
		return fail(err)
	}
	if g.readerSupervisor, err = supervision.OneForOne(supervision.Options{Observer: g.observer("reader")}); err != nil {
		return fail(err)
	}
	coordinatorObserver := supervision.Observers(g.observer("coordinator"), supervision.ObserverFunc(g.coordinatorDecision))
	if g.coordinatorSupervisor, err = supervision.OneForOne(supervision.Options{Observer: coordinatorObserver}); err != nil {
		return fail(err)
	}
	props := actor.PropsFromProducer(func() actor.Actor { return &coordinator{g: g} },
		actor.WithSupervisor(g.readerSupervisor), actor.WithGuardian(g.coordinatorSupervisor))
	// Registered under the runtime's lock while it runs, so that a
	// runtime's Stop either sees the group or refuses it.
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if st := rt.life.State(); st != startstop.Running {
		return fail(fmt.Errorf("kumi: start group: the runtime is %v: %w", st, ErrStopped))
	}
	g.unregister = unregister
	gr.coordinator = rt.system.Root.Spawn(props)
	rt.groups[gr] = struct{}{}
	return nil
}

// passLinger is how long a group's lease pass waits for the passes of
// the runtime's other groups to join its round trip
// (leasestore.PassBatcher). The groups' heartbeats are aligned
// (Runtime.beat), so their passes come within a few milliseconds of one
// another.
const passLinger = 20 * time.Millisecond

// nextBeat is how long from now until the next heartbeat of a group whose
// heartbeats fall at origin + n × interval.
func nextBeat(origin time.Time, interval time.Duration) time.Duration {
	return interval - time.Since(origin)%interval
}

// leaseCancelDeadline is how long a lease pool's connection waits for the
// server to answer a cancelled statement before it is closed.
const leaseCancelDeadline = time.Second

// newLeasePool makes the process's pool for its groups' lease stores, with
// the store pool's settings and conns connections (RuntimeOptions.
// LeasePoolConns). Renewal must never queue behind the readers' and
// handlers' work for a connection of the store's pool: a busy pool would
// delay the passes until the leases became unsure and other workers took
// the buckets over. The groups' passes share it: each holds a connection
// for a round trip or two per heartbeat.
func newLeasePool(ctx context.Context, store *pgxpool.Pool, conns int) (*pgxpool.Pool, error) {
	cfg := store.Config().Copy()
	n := int32(min(conns, MaxLeasePoolConns)) // validated by New
	cfg.MaxConns = n
	cfg.MinConns = min(cfg.MinConns, n)
	cfg.MinIdleConns = min(cfg.MinIdleConns, n)
	// A statement whose context ends (a pass abandoned at its bound) is
	// cancelled on the server, and the connection kept: pgx's default
	// closes it, and the next pass pays a reconnect and the statements'
	// preparation, which on a loaded host made the next pass too slow in
	// turn (TestAnAbandonedPassKeepsItsConnection). A server that does not
	// answer the cancel within leaseCancelDeadline gets the connection
	// closed, as before.
	cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: leaseCancelDeadline}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("kumi: lease pool: %w", err)
	}
	return pool, nil
}

// Worker returns this worker's id in the group.
func (gr *Group) Worker() string { return gr.g.opts.Worker }

// Done is closed when the group has stopped: by [Group.Stop], by
// [Group.Abort], or on a failure it cannot recover from (see [Group.Err]).
func (gr *Group) Done() <-chan struct{} { return gr.g.done }

// Err returns why the group ended, once [Group.Done] is closed: nil after
// a clean stop, ctx.Err() when a Stop's context ended first, the error of
// the final lease release, or a *[GroupFailedError] when a failure nothing
// restarts ended it (a reader's configuration error: a missing table or
// grant). While the group runs it returns nil.
func (gr *Group) Err() error {
	gr.g.mu.Lock()
	defer gr.g.mu.Unlock()
	return gr.g.err
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

// ownedBuckets returns the buckets the group holds, sorted.
func (g *group) ownedBuckets() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]int, 0, len(g.owned))
	for b := range g.owned {
		out = append(out, b)
	}
	sort.Ints(out)
	return out
}

func (g *group) setOwned(owned map[int]leasestore.Lease, handoff map[int]bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.owned = make(map[int]leasestore.Lease, len(owned))
	for b, l := range owned {
		g.owned[b] = l
	}
	g.handoff = make(map[int]bool, len(handoff))
	for b := range handoff {
		g.handoff[b] = true
	}
	for b := range g.queues {
		if _, ok := owned[b]; !ok {
			delete(g.queues, b)
		}
	}
}

// observer reports supervision decisions about actors of a kind to the
// telemetry and to the runtime's observer.
func (g *group) observer(kind string) supervision.Observer {
	return supervision.Observers(g.rt.opts.Supervision, supervision.ObserverFunc(func(d supervision.Decision) {
		g.telemetry.t.SupervisionDecision(context.Background(), observability.SupervisionInfo{
			Actor: kind, Child: d.Child, Subscription: g.opts.Subscription, Strategy: d.Strategy,
			Directive: d.Directive.String(), Reason: d.Reason, Restarts: d.Attempt, Backoff: d.Delay,
		})
	}))
}

// coordinatorDecision notes a decision of the coordinator's guardian to
// stop it: a failure nothing restarts (a reader's configuration error,
// escalated, or the coordinator's restart budget exhausted). The
// coordinator then ends the group with it (see coordinator.onStopped).
func (g *group) coordinatorDecision(d supervision.Decision) {
	if d.Directive != actor.StopDirective {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failure == nil {
		g.failure = newGroupFailedError(g.opts.Subscription, d)
	}
}

// failed returns why the coordinator's guardian stopped it, or nil.
func (g *group) failed() *GroupFailedError {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failure
}

func (g *group) setPass(res leasestore.PassResult, start time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.liveWorkers = res.Live
	g.renewedAt, g.passErr = start, nil
}

// passFailed records the error of a failed lease pass for Healthy.
func (g *group) passFailed(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.passErr = err
}

// HealthError is why [Runtime.Healthy] reports a group unhealthy.
type HealthError struct {
	// Subscription is the group's.
	Subscription string
	// Since is how long ago the last successful lease pass started;
	// Bound the longest that may be (the TTL less the margin).
	Since, Bound time.Duration
	// Err is the last pass's error, or why the group ended.
	Err error
}

// Error says which group, since when, and why.
func (e *HealthError) Error() string {
	if e.Since == 0 {
		return fmt.Sprintf("kumi: subscription %q: group ended: %v", e.Subscription, e.Err)
	}
	return fmt.Sprintf("kumi: subscription %q: no successful lease pass for %v (at most %v): the database is unreachable or too slow: %v",
		e.Subscription, e.Since.Round(time.Millisecond), e.Bound, e.Err)
}

// Unwrap returns the last pass's error, or why the group ended.
func (e *HealthError) Unwrap() error { return e.Err }

// health reports the group unhealthy once it has gone longer than the TTL
// less the margin without a successful lease pass — by then its readers
// have stopped on unsure leases — or when it has ended.
func (g *group) health() error {
	select {
	case <-g.done:
		g.mu.Lock()
		defer g.mu.Unlock()
		err := g.err
		if err == nil {
			err = errors.New("stopped")
		}
		return &HealthError{Subscription: g.opts.Subscription, Err: err}
	default:
	}
	cfg := g.leases.Config()
	bound := cfg.TTL - cfg.Margin
	g.mu.Lock()
	defer g.mu.Unlock()
	if since := time.Since(g.renewedAt); since > bound {
		err := g.passErr
		if err == nil {
			err = errors.New("a pass is still under way")
		}
		return &HealthError{Subscription: g.opts.Subscription, Since: since, Bound: bound, Err: err}
	}
	return nil
}

// Healthy reports whether this process can do its work: nil while every
// group it runs has renewed its leases within the TTL less the margin (so
// it reaches the database and its readers deliver), else a *[HealthError]
// per group that has not, or that ended. A runtime that is stopped is
// unhealthy. It costs no database call: serve it on /healthz
// (observability.HandlerOptions.Healthy).
func (rt *Runtime) Healthy(context.Context) error {
	rt.mu.Lock()
	if st := rt.life.State(); st != startstop.Running {
		rt.mu.Unlock()
		return fmt.Errorf("kumi: runtime is not running (%v)", st)
	}
	groups := make([]*Group, 0, len(rt.groups))
	for g := range rt.groups {
		groups = append(groups, g)
	}
	rt.mu.Unlock()
	var errs []error
	for _, g := range groups {
		errs = append(errs, g.g.health())
	}
	return errors.Join(errs...)
}

// lagInterval spaces the lag measurements: counting a backlog costs a
// range scan per bucket, too much for every pass.
const lagInterval = 5 * time.Second

// measureLags keeps the owned buckets' lag at most lagInterval old, and
// measures it soon after the set of owned buckets changes, until ctx
// ends: it looks every heartbeat, and when the group's measurement is due
// it measures every group of the process in one statement (see
// Runtime.measureAllLags), so that the other groups find theirs fresh. It
// runs on its own goroutine, over the store's pool, bounded by
// DatabaseTimeout: the measurement is optional and may be slow, so it
// never rides on the lease passes, which renew the leases.
func (g *group) measureLags(ctx context.Context) {
	t := time.NewTicker(g.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		decided := time.Now()
		if !g.lagDue(decided) {
			continue
		}
		mctx, cancel := context.WithTimeout(ctx, g.opts.DatabaseTimeout)
		err := g.rt.measureAllLags(mctx, g, decided)
		cancel()
		if err != nil && ctx.Err() == nil {
			g.logger.Debug("kumi: lag measurement failed; keeping the last one", "err", err)
		}
	}
}

// lagDue reports whether the group's lag is to be measured at now: its
// last measurement is lagInterval old, or was of other buckets.
func (g *group) lagDue(now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return now.Sub(g.lagAt) >= lagInterval || len(g.owned) != len(g.lags)
}

// lagRequest is a group's part of a measurement of the process's lag.
type lagRequest struct {
	g    *group
	held []leasestore.Lease
}

// measureAllLags measures the lag of every group of the process that holds
// buckets, in one statement, and gives each group its part. A measurement
// made after decided (another group's, while the asking group waited for
// it) makes the asking group's unnecessary: it returns at once. A failed
// measurement leaves every group's last one (it counts as a try all the
// same, so that the groups do not retry at every heartbeat).
func (rt *Runtime) measureAllLags(ctx context.Context, asking *group, decided time.Time) error {
	rt.lagMu.Lock()
	defer rt.lagMu.Unlock()
	asking.mu.Lock()
	fresh := asking.lagAt.After(decided)
	asking.mu.Unlock()
	if fresh {
		return nil
	}
	rt.mu.Lock()
	groups := make([]*group, 0, len(rt.groups)+1)
	for gr := range rt.groups {
		groups = append(groups, gr.g)
	}
	rt.mu.Unlock()
	if !slices.Contains(groups, asking) {
		groups = append(groups, asking) // started, but not registered yet
	}
	var reqs []lagRequest
	var buckets []eventsource.LagBucket
	for _, g := range groups {
		held, resize := g.heldForLag()
		reqs = append(reqs, lagRequest{g: g, held: held})
		buckets = append(buckets, lagBuckets(g.opts.Subscription, g.opts.Category, held, resize)...)
	}
	var lags []eventsource.BucketBacklog
	var err error
	if len(buckets) > 0 {
		lags, err = rt.bucketLags(ctx, buckets)
	}
	at := time.Now()
	for _, r := range reqs {
		var part []eventsource.BucketBacklog
		if err == nil {
			part, lags = lags[:len(r.held)], lags[len(r.held):]
		}
		r.g.setLags(at, r.held, part, err)
	}
	return err
}

// heldForLag returns the group's held buckets and resize, as measuring
// their lag needs them.
func (g *group) heldForLag() ([]leasestore.Lease, leasestore.Resize) {
	g.mu.Lock()
	defer g.mu.Unlock()
	held := make([]leasestore.Lease, 0, len(g.owned))
	for _, l := range g.owned {
		held = append(held, l)
	}
	return held, g.resize
}

// setLags records a measurement of the held buckets' lag made at at (or
// its failure: the last one stays).
func (g *group) setLags(at time.Time, held []leasestore.Lease, lags []eventsource.BucketBacklog, err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lagAt = at
	if err != nil {
		return
	}
	g.lags = make(map[int]bucketLag, len(held))
	for i, l := range held {
		g.lags[l.Slot] = bucketLag{checkpoint: lags[i].Checkpoint, events: lags[i].Events, oldest: lags[i].Oldest}
	}
}

// lagBuckets is what measuring the held buckets' lag asks of the store.
func lagBuckets(subscription, category string, held []leasestore.Lease, resize leasestore.Resize) []eventsource.LagBucket {
	out := make([]eventsource.LagBucket, len(held))
	for i, l := range held {
		out[i] = eventsource.LagBucket{Subscription: subscription, Category: category, Slot: l.Slot, Bucket: l.Bucket,
			Buckets: l.Buckets, Until: lagUntil(l, resize)}
	}
	return out
}

// lagUntil is the last position a held bucket has to deliver: the cut for
// a bucket of the serving generation once a resize decided it (its events
// beyond belong to the next generation), else none.
func lagUntil(l leasestore.Lease, r leasestore.Resize) int64 {
	if r.Resizing() && r.CutDecided && l.Generation == r.Generation {
		return r.Cut
	}
	return math.MaxInt64
}

// statusSnapshot is the group's status for observability, from memory.
func (g *group) statusSnapshot() observability.SubscriptionStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := observability.SubscriptionStatus{Subscription: g.opts.Subscription, Worker: g.leases.Worker(), Buckets: g.buckets(), LiveWorkers: g.liveWorkers}
	for b, l := range g.owned {
		lag := g.lags[b]
		bs := observability.BucketStatus{Generation: l.Generation, Bucket: l.Bucket, Slot: b, Epoch: l.Epoch, State: "reading", Checkpoint: max(lag.checkpoint, g.progress[b]), LagEvents: lag.events}
		if st := g.readerStates[b]; st != "" {
			bs.State = st
		}
		if g.handoff[b] {
			bs.State = "handing_off"
		}
		if !l.Ready {
			bs.State = "standby" // a next generation's bucket, waiting for its feeders to drain
		}
		if !lag.oldest.IsZero() && lag.events > 0 {
			bs.LagSeconds = time.Since(lag.oldest).Seconds()
		}
		if q := g.queues[b]; q != nil {
			qs := q.Stats()
			bs.QueueDepth, bs.QueueBytes = qs.Depth, qs.Bytes
		}
		if rep, ok := g.reports[b]; ok {
			rs := rep.st
			bs.Reader = &rs
		}
		st.Owned = append(st.Owned, bs)
	}
	sort.Slice(st.Owned, func(i, j int) bool { return st.Owned[i].Slot < st.Owned[j].Slot })
	st.Published = g.rt.published.Load()
	return st
}

func (g *group) setProgress(bucket int, pos int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.progress[bucket] = max(g.progress[bucket], pos)
}

func (g *group) registerQueue(bucket int, q *overflow.Queue) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queues[bucket] = q
}

// buckets is the serving generation's bucket count: the database's, once
// a pass has read it, else the configured one. Call with mu held.
func (g *group) buckets() int {
	if g.resize.Buckets > 0 {
		return g.resize.Buckets
	}
	return g.opts.Buckets
}

// BucketStatus is one owned bucket's state.
type BucketStatus struct {
	// Bucket is the bucket within Generation (docs/design/resize.md); Slot the
	// key of its lease and checkpoint (the bucket itself in generation 0).
	Bucket     int   `json:"bucket"`
	Generation int   `json:"generation"`
	Slot       int   `json:"slot"`
	Epoch      int64 `json:"epoch"`
	// Ready is false for a next generation's bucket held on standby
	// during a resize: no reader until its feeders drained.
	Ready bool `json:"ready"`
	// Checkpoint is the stored position; Lag the bucket's events after it.
	Checkpoint int64 `json:"checkpoint"`
	Lag        int64 `json:"lag"`
	// HandingOff says a claimant waits for this bucket.
	HandingOff bool `json:"handing_off"`
	// QueueDepth is the reader's queue of live batches, QueueBytes their
	// size.
	QueueDepth int   `json:"queue_depth"`
	QueueBytes int64 `json:"queue_bytes"`
	// Reader is what the bucket's reader last reported of itself: how far
	// it read and handled, and what it waits for; nil while the bucket
	// has no reader.
	Reader *observability.ReaderStatus `json:"reader,omitempty"`
}

// Status is a snapshot of a group in this process.
type Status struct {
	Subscription string `json:"subscription"`
	Category     string `json:"category"`
	Worker       string `json:"worker"`
	// Buckets and Generation are the serving generation's, as the
	// database has them (see GroupOptions.Buckets).
	Buckets    int `json:"buckets"`
	Generation int `json:"generation"`
	// Resize is the resize in progress as the last pass read it: its
	// state (leasestore.ResizeSteady when none), next bucket count and
	// cut.
	Resize ResizeStatus   `json:"resize"`
	Head   int64          `json:"head"`
	Owned  []BucketStatus `json:"owned"`
}

// ResizeStatus is a resize in progress, as a group's last pass read it.
type ResizeStatus struct {
	State       leasestore.ResizeState `json:"state"`                  // leasestore.ResizeSteady when none runs
	NextBuckets int                    `json:"next_buckets,omitempty"` // M, while a resize runs
	Cut         int64                  `json:"cut,omitempty"`          // C, once CutDecided
	CutDecided  bool                   `json:"cut_decided,omitempty"`  // the state is cut or switched
}

// Status returns the buckets this worker owns with their epochs,
// checkpoints and lag (events of the bucket after its checkpoint).
func (gr *Group) Status(ctx context.Context) (Status, error) {
	g := gr.g
	g.mu.Lock()
	st := Status{Subscription: g.opts.Subscription, Category: g.opts.Category, Worker: g.leases.Worker(), Buckets: g.buckets(),
		Generation: g.resize.Generation, Resize: ResizeStatus{State: g.resize.State, NextBuckets: g.resize.NextBuckets,
			Cut: g.resize.Cut, CutDecided: g.resize.CutDecided}}
	if st.Resize.State == "" {
		st.Resize.State = leasestore.ResizeSteady
	}
	resize := g.resize
	held := make([]leasestore.Lease, 0, len(g.owned))
	for b, l := range g.owned {
		held = append(held, l)
		bs := BucketStatus{Bucket: l.Bucket, Generation: l.Generation, Slot: b, Epoch: l.Epoch, Ready: l.Ready,
			HandingOff: g.handoff[b]}
		if q := g.queues[b]; q != nil {
			qs := q.Stats()
			bs.QueueDepth, bs.QueueBytes = qs.Depth, qs.Bytes
		}
		if rep, ok := g.reports[b]; ok {
			rs := rep.st
			bs.Reader = &rs
		}
		st.Owned = append(st.Owned, bs)
	}
	g.mu.Unlock()
	sort.Slice(st.Owned, func(i, j int) bool { return st.Owned[i].Slot < st.Owned[j].Slot })
	head, err := g.store.HeadPosition(ctx)
	if err != nil {
		return st, err
	}
	st.Head = head
	if len(held) == 0 {
		return st, nil
	}
	lags, err := g.store.BucketLags(ctx, lagBuckets(g.opts.Subscription, g.opts.Category, held, resize))
	if err != nil {
		return st, err
	}
	bySlot := make(map[int]eventsource.BucketBacklog, len(lags))
	for i, l := range held {
		bySlot[l.Slot] = lags[i]
	}
	for i := range st.Owned {
		b := &st.Owned[i]
		b.Checkpoint, b.Lag = bySlot[b.Slot].Checkpoint, bySlot[b.Slot].Events
	}
	return st, nil
}
