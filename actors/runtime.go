package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// RuntimeOptions configure a [Runtime]. Zero values mean defaults.
type RuntimeOptions struct {
	// Logger receives kumi's logs; nil discards them.
	Logger *slog.Logger
	// Telemetry records traces and metrics; nil uses the OpenTelemetry
	// globals (no-op unless configured, see observability.Setup).
	Telemetry *observability.Telemetry
	// PollInterval is the publisher's safety poll. Default 1 s.
	PollInterval time.Duration
	// Sequencer tunes this process's sequencer.
	Sequencer eventsource.SequencerOptions
	// Supervision observes every supervision decision (restarts, stops);
	// nil logs them at Debug.
	Supervision supervision.Observer
}

// Runtime is kumi's per-process machinery over one event store: the
// sequencer, the notifier and the Publisher actor shared by every group.
// Start one per process, then a [Group] per subscription.
type Runtime struct {
	system    *actor.ActorSystem
	store     *eventsource.Store
	opts      RuntimeOptions
	logger    *slog.Logger
	telemetry *telemetry
	sequencer *eventsource.Sequencer
	notifier  *eventsource.Notifier
	listener  *eventsource.Listener
	publisher *actor.PID
	// dispatcher runs the readers' and handlers' mailboxes on reused
	// goroutines.
	dispatcher *dispatcher

	mu      sync.Mutex
	groups  map[*Group]struct{}
	stopped bool
}

// NewRuntime migrates the store's schema (idempotent), starts the
// sequencer and notifier, and spawns the Publisher on system.
func NewRuntime(ctx context.Context, system *actor.ActorSystem, store *eventsource.Store, opts RuntimeOptions) (*Runtime, error) {
	if system == nil {
		return nil, &OptionError{"system", nil, "required"}
	}
	if store == nil {
		return nil, &OptionError{"store", nil, "required"}
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = time.Second
	}
	if opts.PollInterval < 0 {
		return nil, &OptionError{"PollInterval", opts.PollInterval, "must be positive"}
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if err := Migrate(ctx, store); err != nil {
		return nil, err
	}
	rt := &Runtime{system: system, store: store, opts: opts, logger: logger, groups: map[*Group]struct{}{},
		dispatcher: newDispatcher(64, 300)}
	rt.telemetry = newTelemetry(opts.Telemetry, logger)
	if opts.Sequencer.Logger == nil {
		opts.Sequencer.Logger = logger
	}
	rt.sequencer = eventsource.NewSequencer(store, opts.Sequencer)
	rt.sequencer.Start()
	var reconnects atomic.Int64
	notifier, err := store.NewNotifier(eventsource.NotifierOptions{Logger: logger, PollInterval: opts.PollInterval,
		OnReconnect: func(err error) {
			rt.telemetry.t.NotifierReconnect(context.Background(), int(reconnects.Add(1)), err)
		}})
	if err != nil {
		rt.sequencer.Stop()
		return nil, err
	}
	listener, err := notifier.Listen(store.NotifyChannel())
	if err == nil {
		err = notifier.Start(ctx)
	}
	if err != nil {
		rt.sequencer.Stop()
		return nil, err
	}
	rt.notifier, rt.listener = notifier, listener
	rt.publisher = system.Root.Spawn(newPublisherProps(store, listener.C(), opts.PollInterval, logger, rt.telemetry))
	return rt, nil
}

// Migrate creates or upgrades everything kumi keeps in the store's schema:
// the event store's tables and the lease store's. It is idempotent, safe
// from several processes at once, and issues no DDL on an up-to-date
// schema. NewRuntime calls it.
func Migrate(ctx context.Context, store *eventsource.Store) error {
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("kumi: migrate event store: %w", err)
	}
	if err := leasestore.Migrate(ctx, store.Pool(), store.Schema()); err != nil {
		return fmt.Errorf("kumi: migrate lease store: %w", err)
	}
	return nil
}

// Store returns the runtime's event store.
func (rt *Runtime) Store() *eventsource.Store { return rt.store }

// Stop stops every group gracefully (see [Group.Stop]), then the publisher,
// notifier and sequencer. It returns ctx.Err() if ctx ends first.
func (rt *Runtime) Stop(ctx context.Context) error {
	rt.mu.Lock()
	groups := make([]*Group, 0, len(rt.groups))
	for g := range rt.groups {
		groups = append(groups, g)
	}
	already := rt.stopped
	rt.stopped = true
	rt.mu.Unlock()
	var errs []error
	for _, g := range groups {
		errs = append(errs, g.Stop(ctx))
	}
	if !already {
		_ = rt.system.Root.StopFuture(rt.publisher).Wait()
		rt.listener.Close()
		errs = append(errs, rt.notifier.Stop(ctx))
		rt.sequencer.Stop()
		rt.dispatcher.close()
	}
	return errors.Join(errs...)
}

// Group is one subscription group running in this process: a Coordinator
// actor and a BucketReader per owned bucket.
type Group struct {
	g           *group
	coordinator *actor.PID
	stopOnce    sync.Once
}

// group is what a group's actors share.
type group struct {
	rt                *Runtime
	opts              GroupOptions
	store             *eventsource.Store
	leases            *leasestore.Store
	publisher         *actor.PID
	logger            *slog.Logger
	telemetry         *telemetry
	handlerSupervisor *supervision.Strategy
	readerSupervisor  *supervision.Strategy
	// coordinatorSupervisor restarts a failed coordinator (its readers
	// stop with it; the restarted one reclaims and respawns).
	coordinatorSupervisor *supervision.Strategy
	interval              time.Duration

	mu         sync.Mutex
	owned      map[int]leasestore.Lease
	handoff    map[int]bool
	progress   map[int]int64
	lags       map[int]bucketLag
	lagAt      time.Time
	members    int
	queues     map[int]*overflow.Queue
	done       chan struct{}
	err        error
	unregister func()
	// dropped counts the live batches the readers' queues dropped on a
	// pause or an overflow (each re-read from the store).
	dropped atomic.Int64
	// readerStates holds the readers' states other than reading (see
	// setReaderState), guarded by mu.
	readerStates map[int]string
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

// StartGroup starts a subscription group in this process. Every process
// that starts a group with the same Subscription shares its buckets. The
// options are validated first, each error naming its field.
func (rt *Runtime) StartGroup(ctx context.Context, opts GroupOptions) (*Group, error) {
	opts = opts.WithDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	rt.mu.Lock()
	stopped := rt.stopped
	rt.mu.Unlock()
	if stopped {
		return nil, errors.New("kumi: runtime is stopped")
	}
	logger := opts.Logger
	if logger == nil {
		logger = rt.logger
	}
	logger = logger.With("subscription", opts.Subscription)
	leases, err := leasestore.New(ctx, rt.store.Pool(), leasestore.Config{
		Schema:       rt.store.Schema(),
		Subscription: opts.Subscription,
		Worker:       opts.Worker,
		Buckets:      opts.Buckets,
		Kind:         opts.Lease.Kind,
		TTL:          opts.Lease.TTL,
		Heartbeat:    opts.Lease.Heartbeat,
		Margin:       opts.Lease.Margin,
		SessionURL:   opts.Lease.SessionURL,
		NoListen:     opts.Lease.NoListen,
		Logger:       logger,
	})
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*Group, error) {
		_ = leases.Close()
		return nil, err
	}
	if err := leases.EnsureShards(ctx); err != nil {
		return fail(err)
	}
	if err := rt.store.EnsureConsumerGroupIndex(ctx, opts.Buckets); err != nil {
		return fail(err)
	}
	g := &group{
		rt: rt, opts: opts, store: rt.store, leases: leases, publisher: rt.publisher, logger: logger,
		interval: leases.Config().Heartbeat,
		owned:    map[int]leasestore.Lease{}, handoff: map[int]bool{}, progress: map[int]int64{},
		queues: map[int]*overflow.Queue{}, done: make(chan struct{}),
	}
	g.telemetry = rt.telemetry.forGroup(opts.Subscription, leases.Worker())
	g.lags = map[int]bucketLag{}
	g.unregister = g.telemetry.t.RegisterStatus(g.statusSnapshot)
	if g.handlerSupervisor, err = supervision.OneForOne(supervision.Options{Observer: g.observer("handler")}); err != nil {
		return fail(err)
	}
	if g.readerSupervisor, err = supervision.OneForOne(supervision.Options{Observer: g.observer("reader")}); err != nil {
		return fail(err)
	}
	if g.coordinatorSupervisor, err = supervision.OneForOne(supervision.Options{Observer: g.observer("coordinator")}); err != nil {
		return fail(err)
	}
	props := actor.PropsFromProducer(func() actor.Actor { return &coordinator{g: g} },
		actor.WithSupervisor(g.readerSupervisor), actor.WithGuardian(g.coordinatorSupervisor))
	group := &Group{g: g, coordinator: rt.system.Root.Spawn(props)}
	rt.mu.Lock()
	rt.groups[group] = struct{}{}
	rt.mu.Unlock()
	return group, nil
}

// Worker returns this worker's id in the group.
func (gr *Group) Worker() string { return gr.g.leases.Worker() }

// Done is closed when the group has stopped.
func (gr *Group) Done() <-chan struct{} { return gr.g.done }

// Stop stops the group gracefully: each reader finishes its in-flight event
// and flushes its checkpoint, then every lease is released and the worker
// leaves the membership, so other workers take the buckets over at once.
// It is idempotent and safe from several goroutines. If ctx ends first it
// stops the actors at once, leaves the leases to expire, and returns
// ctx.Err().
func (gr *Group) Stop(ctx context.Context) error {
	gr.stopOnce.Do(func() { gr.g.rt.system.Root.Send(gr.coordinator, stopGroup{}) })
	select {
	case <-gr.g.done:
	case <-ctx.Done():
		_ = gr.g.rt.system.Root.StopFuture(gr.coordinator).Wait()
		gr.g.finish(ctx.Err())
		return ctx.Err()
	}
	gr.g.rt.mu.Lock()
	delete(gr.g.rt.groups, gr)
	gr.g.rt.mu.Unlock()
	gr.g.mu.Lock()
	defer gr.g.mu.Unlock()
	return gr.g.err
}

// Abort stops the group at once, as a crash would: readers stop without
// finishing their in-flight events or flushing checkpoints, and no lease is
// released. Other workers take the buckets over when the leases expire (for
// the session kind, at once: the session closes). Events after the last
// flushed checkpoint are delivered again by the next owner. Use [Group.Stop]
// for a graceful stop.
func (gr *Group) Abort() {
	_ = gr.g.rt.system.Root.StopFuture(gr.coordinator).Wait()
	gr.g.finish(nil)
	gr.g.rt.mu.Lock()
	delete(gr.g.rt.groups, gr)
	gr.g.rt.mu.Unlock()
}

func (g *group) finish(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.done:
		return
	default:
	}
	g.err = err
	g.handlerSupervisor.Close()
	g.readerSupervisor.Close()
	g.coordinatorSupervisor.Close()
	_ = g.leases.Close()
	g.unregister()
	close(g.done)
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

func (g *group) setPass(res leasestore.PassResult, lags map[int]bucketLag) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.members = res.Live
	if lags != nil {
		g.lags = lags
	}
}

// lagInterval spaces the lag measurements: counting a backlog costs a
// range scan per bucket, too much for every pass.
const lagInterval = 5 * time.Second

// measureLag reads each owned bucket's checkpoint and backlog, at most once
// per lagInterval (nil otherwise: keep the last measurement).
func (g *group) measureLag(ctx context.Context, owned []leasestore.Lease) map[int]bucketLag {
	now := time.Now()
	g.mu.Lock()
	due := now.Sub(g.lagAt) >= lagInterval || len(owned) != len(g.lags)
	if due {
		g.lagAt = now
	}
	g.mu.Unlock()
	if !due {
		return nil
	}
	out := make(map[int]bucketLag, len(owned))
	if len(owned) == 0 {
		return out
	}
	cps, err := g.store.Checkpoints(ctx, g.opts.Subscription)
	if err != nil {
		return out
	}
	byBucket := map[int]int64{}
	for _, c := range cps {
		byBucket[c.Bucket] = c.Position
	}
	for _, l := range owned {
		cp := byBucket[l.Bucket]
		n, oldest, err := g.store.MemberLag(ctx, g.opts.Category, l.Bucket, g.opts.Buckets, cp)
		if err != nil {
			return out
		}
		out[l.Bucket] = bucketLag{checkpoint: cp, events: n, oldest: oldest}
	}
	return out
}

// statusSnapshot is the group's status for observability, from memory.
func (g *group) statusSnapshot() observability.SubscriptionStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := observability.SubscriptionStatus{Subscription: g.opts.Subscription, Worker: g.leases.Worker(), Buckets: g.opts.Buckets, Members: g.members}
	for b, l := range g.owned {
		lag := g.lags[b]
		bs := observability.BucketStatus{Bucket: b, Epoch: l.Epoch, State: "reading", Checkpoint: max(lag.checkpoint, g.progress[b]), LagEvents: lag.events}
		if st := g.readerStates[b]; st != "" {
			bs.State = st
		}
		if g.handoff[b] {
			bs.State = "handing_off"
		}
		if !lag.oldest.IsZero() && lag.events > 0 {
			bs.LagSeconds = time.Since(lag.oldest).Seconds()
		}
		if q := g.queues[b]; q != nil {
			bs.QueueDepth = q.Depth()
		}
		st.Owned = append(st.Owned, bs)
	}
	sort.Slice(st.Owned, func(i, j int) bool { return st.Owned[i].Bucket < st.Owned[j].Bucket })
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

// BucketStatus is one owned bucket's state.
type BucketStatus struct {
	Bucket int   `json:"bucket"`
	Epoch  int64 `json:"epoch"`
	// Checkpoint is the stored position; Lag the bucket's events after it.
	Checkpoint int64 `json:"checkpoint"`
	Lag        int64 `json:"lag"`
	// HandingOff says a claimant waits for this bucket.
	HandingOff bool `json:"handing_off"`
	// QueueDepth is the reader's queue of live batches.
	QueueDepth int `json:"queue_depth"`
}

// Status is a snapshot of a group in this process.
type Status struct {
	Subscription string         `json:"subscription"`
	Category     string         `json:"category"`
	Worker       string         `json:"worker"`
	Buckets      int            `json:"buckets"`
	Head         int64          `json:"head"`
	Owned        []BucketStatus `json:"owned"`
}

// Status returns the buckets this worker owns with their epochs,
// checkpoints and lag (events of the bucket after its checkpoint).
func (gr *Group) Status(ctx context.Context) (Status, error) {
	g := gr.g
	g.mu.Lock()
	st := Status{Subscription: g.opts.Subscription, Category: g.opts.Category, Worker: g.leases.Worker(), Buckets: g.opts.Buckets}
	for b, l := range g.owned {
		bs := BucketStatus{Bucket: b, Epoch: l.Epoch, HandingOff: g.handoff[b]}
		if q := g.queues[b]; q != nil {
			bs.QueueDepth = q.Depth()
		}
		st.Owned = append(st.Owned, bs)
	}
	g.mu.Unlock()
	sort.Slice(st.Owned, func(i, j int) bool { return st.Owned[i].Bucket < st.Owned[j].Bucket })
	head, err := g.store.HeadPosition(ctx)
	if err != nil {
		return st, err
	}
	st.Head = head
	cps, err := g.store.Checkpoints(ctx, g.opts.Subscription)
	if err != nil {
		return st, err
	}
	byBucket := map[int]int64{}
	for _, c := range cps {
		byBucket[c.Bucket] = c.Position
	}
	for i := range st.Owned {
		b := &st.Owned[i]
		b.Checkpoint = byBucket[b.Bucket]
		if b.Lag, _, err = g.store.MemberLag(ctx, g.opts.Category, b.Bucket, g.opts.Buckets, b.Checkpoint); err != nil {
			return st, err
		}
	}
	return st, nil
}
