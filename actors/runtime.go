package actors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// RuntimeOptions configure a [Runtime]. Zero values mean defaults.
type RuntimeOptions struct {
	// Logger receives kumi's logs; nil discards them.
	Logger *slog.Logger
	// Telemetry records traces and metrics; nil uses the OpenTelemetry
	// globals (no-op unless configured, see otelsetup.Setup).
	Telemetry *observability.Telemetry
	// PollInterval is the publisher's safety poll. Default 1 s.
	PollInterval time.Duration
	// Sequencer tunes this process's sequencer.
	Sequencer eventsource.SequencerOptions
	// Supervision observes every supervision decision (restarts, stops);
	// nil logs them at Debug.
	Supervision supervision.Observer
	// QueueBytes bounds, in bytes, the live batches queued for every
	// reader of every group of this process together: a batch that would
	// take them over it applies its reader's overflow policy, as a full
	// queue does (see GroupOptions.QueueBytes for one reader's bound).
	// Each reader also reads ahead of its handler at most its share of it
	// (QueueBytes divided by the running readers, at least 64 KiB) when
	// that is less than its GroupOptions.QueueBytes. Default 256 MiB
	// (RuntimeQueueBytesDefault); at least 16 MiB.
	QueueBytes int64
	// ReadPool, when set, is a pool on a hot standby of the store's
	// database: the readers' catch-up pages and the publisher's reads go
	// there, and everything else (appends, the sequencer, leases,
	// checkpoints, dead letters, exactly-once commits, LISTEN) stays on
	// the store's pool. Nothing is skipped or reordered however far the
	// standby lags: see eventsource.ReadReplica and docs/design/eventsource.md,
	// "Reading from a hot standby". Nil (the default) reads on the primary.
	// The runtime does not close it.
	ReadPool *pgxpool.Pool
	// ReadReplica tunes the reads on ReadPool (its Logger defaults to
	// Logger); ignored without a ReadPool.
	ReadReplica eventsource.ReadReplicaOptions
	// LeasePoolConns is the size of the process's lease pool: the
	// connections, made with the store pool's settings, that every group
	// of this process shares for its lease passes, handoffs and releases,
	// so that renewals never queue behind the readers' and handlers' work
	// on the store's pool. A pass holds one for a round trip or two per
	// heartbeat. Default 4 (LeasePoolConnsDefault); at least 2 (a pass
	// and a handoff or release beside it), at most 64.
	LeasePoolConns int
}

// Bounds and default of RuntimeOptions.LeasePoolConns.
const (
	LeasePoolConnsDefault = 4
	MinLeasePoolConns     = 2
	MaxLeasePoolConns     = 64
)

// RuntimeQueueBytesDefault is RuntimeOptions.QueueBytes's default: 256 MiB
// lets 32 readers hold their whole default QueueBytes of live batches at
// once; past that, the readers that fall furthest behind pause and re-read
// from the store (losing nothing) instead of growing the process.
const RuntimeQueueBytesDefault = 256 << 20

// Runtime is kumi's per-process machinery over one event store: the
// sequencer, the notifier and the Publisher actor shared by every group.
// Start one per process, then a [Group] per subscription. Its Start and
// Stop follow kumi's lifecycle contract (docs/design/architecture.md,
// "Lifecycle"): [New] makes one, [Runtime.Start] starts it (ctx bounds the
// start only: the runtime runs until [Runtime.Stop]).
type Runtime struct {
	system    *actor.ActorSystem
	store     *eventsource.Store
	opts      RuntimeOptions
	logger    *slog.Logger
	telemetry *telemetry
	sequencer *eventsource.Sequencer
	notifier  *eventsource.Notifier
	listener  *eventsource.Listener
	pub       *publisherService
	publisher *actor.PID // pub's, once started
	// reads serves the catch-up pages and the publisher's reads: the store,
	// or replica when RuntimeOptions.ReadPool is set.
	reads   eventsource.PageReader
	replica *eventsource.ReadReplica
	// bucketLags measures the groups' buckets' checkpoints and backlogs
	// for the lag metrics, in one statement: on the standby with a read
	// pool. lagMu serializes the measurements (see measureAllLags).
	bucketLags func(ctx context.Context, buckets []eventsource.LagBucket) ([]eventsource.BucketBacklog, error)
	lagMu      sync.Mutex
	// published is the publisher's position: every event up to it was
	// posted to its subscribers, or read before they subscribed;
	// publishedEpoch the store's server epoch it belongs to (see
	// publishedIn).
	published, publishedEpoch atomic.Int64
	// unregisterReplica stops the kumi.replica.* metrics.
	unregisterReplica func()
	// dispatcher runs the readers' and handlers' mailboxes on reused
	// goroutines.
	dispatcher *dispatcher
	// budget is RuntimeOptions.QueueBytes, shared by every reader queue;
	// readers counts the running readers, which share it for their
	// read-ahead too (see reader.readAhead).
	budget  *overflow.Budget
	readers atomic.Int64

	// leasePool is the lease stores' pool, shared by every group (see
	// newLeasePool); made by Start, closed by Stop once the groups ended.
	leasePool *pgxpool.Pool
	// passes carries the groups' lease passes in shared round trips (see
	// leasestore.PassBatcher), on leasePool; made by Start.
	passes *leasestore.PassBatcher
	// sessions are the process's KindSession connections, one per
	// session URL ("" for the store pool's settings), each shared by
	// every session-kind group that names that URL: one connection
	// holding one advisory lock per (subscription, worker), however many
	// groups (leasestore.Sessions). Made by the first such group's Start
	// (sessionsFor), under mu; closed by Stop once the groups ended.
	sessions map[string]*leasestore.Sessions
	// beat is the origin of the groups' heartbeats: every group of the
	// runtime with the same heartbeat passes at the same moments
	// (beat + n × heartbeat), so that its passes share a round trip.
	beat time.Time

	// unregisterSequencer stops the kumi.sequencer.* metrics.
	unregisterSequencer func()

	life   startstop.Lifecycle
	mu     sync.Mutex
	groups map[*Group]struct{}
}

// New validates opts, refusing an invalid one with a *[kumierr.ConfigError]
// naming it, and returns a runtime
// that is not started: [Runtime.Start] starts it.
func New(system *actor.ActorSystem, store *eventsource.Store, opts RuntimeOptions) (*Runtime, error) {
	if system == nil {
		return nil, &kumierr.ConfigError{Field: "actors system", Reason: "is required"}
	}
	if store == nil {
		return nil, &kumierr.ConfigError{Field: "actors store", Reason: "is required"}
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = time.Second
	}
	if opts.PollInterval < 0 {
		return nil, invalid("RuntimeOptions.PollInterval", opts.PollInterval, "must be positive")
	}
	if opts.QueueBytes == 0 {
		opts.QueueBytes = RuntimeQueueBytesDefault
	}
	if opts.QueueBytes < MinRuntimeQueueBytes || opts.QueueBytes > MaxQueueBytes {
		return nil, invalid("RuntimeOptions.QueueBytes", opts.QueueBytes, fmt.Sprintf("must be in [%d, %d] bytes (16 MiB to 1 TiB; 0 means %d)",
			MinRuntimeQueueBytes, MaxQueueBytes, RuntimeQueueBytesDefault))
	}
	if opts.LeasePoolConns == 0 {
		opts.LeasePoolConns = LeasePoolConnsDefault
	}
	if opts.LeasePoolConns < MinLeasePoolConns || opts.LeasePoolConns > MaxLeasePoolConns {
		return nil, invalid("RuntimeOptions.LeasePoolConns", opts.LeasePoolConns, fmt.Sprintf("must be in [%d, %d] (0 means %d)",
			MinLeasePoolConns, MaxLeasePoolConns, LeasePoolConnsDefault))
	}
	budget, err := overflow.NewBudget(opts.QueueBytes)
	if err != nil {
		return nil, reroot(err, "overflow limit", "RuntimeOptions.QueueBytes")
	}
	logger := opts.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if opts.Sequencer.Logger == nil {
		opts.Sequencer.Logger = logger
	}
	rt := &Runtime{system: system, store: store, opts: opts, logger: logger, groups: map[*Group]struct{}{},
		dispatcher: newDispatcher(64, 300), budget: budget}
	rt.telemetry = newTelemetry(opts.Telemetry, logger)
	rt.reads, rt.bucketLags, rt.unregisterReplica = store, store.BucketLags, func() {}
	if opts.ReadPool != nil {
		ro := opts.ReadReplica
		if ro.Logger == nil {
			ro.Logger = logger
		}
		replica, err := eventsource.NewReadReplica(store, opts.ReadPool, ro)
		if err != nil {
			return nil, reroot(err, "eventsource.ReadReplicaOptions.", "RuntimeOptions.ReadReplica.")
		}
		rt.reads, rt.replica, rt.bucketLags = replica, replica, replica.BucketLags
	}
	return rt, nil
}

// Start migrates the store's schema (idempotent), starts the sequencer,
// the notifier and the read replica's lag measurement (with a read pool),
// and spawns the Publisher on the runtime's actor system. ctx bounds the
// start only. A second Start does nothing; after Stop it returns
// [kumierr.ErrStopped]; a failed start undoes what it did, and may be tried again.
func (rt *Runtime) Start(ctx context.Context) error { return rt.life.Start(ctx, rt.start) }

func (rt *Runtime) start(ctx context.Context) (err error) {
	if err := Migrate(ctx, rt.store); err != nil {
		return err
	}
	var reconnects atomic.Int64
	notifier, err := rt.store.NewNotifier(eventsource.NotifierOptions{Logger: rt.logger, PollInterval: rt.opts.PollInterval,
		OnReconnect: func(err error) {
			rt.telemetry.t.NotifierReconnect(context.Background(), int(reconnects.Add(1)), err)
		}})
	if err != nil {
		return err
	}
	listener, err := notifier.Listen(rt.store.NotifyChannel())
	if err != nil {
		return err
	}
	leasePool, err := newLeasePool(ctx, rt.store.Pool(), rt.opts.LeasePoolConns)
	if err != nil {
		listener.Close()
		return err
	}
	var started []startstop.Service
	defer func() {
		if err != nil { // undo, in reverse
			leasePool.Close()
			listener.Close()
			for _, s := range slices.Backward(started) {
				err = errors.Join(err, s.Stop(context.WithoutCancel(ctx)))
			}
		}
	}()
	pub := &publisherService{system: rt.system, logger: rt.logger,
		props: newPublisherProps(rt.reads, publisherOptions{wake: listener.C(), poll: rt.opts.PollInterval, known: listener.Latest,
			published: &rt.published, publishedEpoch: &rt.publishedEpoch, server: rt.store.Server, logger: rt.logger, tel: rt.telemetry})}
	sequencer := eventsource.NewSequencer(rt.store, rt.opts.Sequencer)
	services := []startstop.Service{sequencer, notifier, pub}
	if rt.replica != nil {
		services = append(services, rt.replica)
	}
	for _, s := range services {
		if err := s.Start(ctx); err != nil {
			return err
		}
		started = append(started, s)
	}
	rt.sequencer, rt.notifier, rt.listener, rt.pub, rt.publisher = sequencer, notifier, listener, pub, pub.pid
	rt.leasePool = leasePool
	if rt.passes, err = leasestore.NewPassBatcher(leasePool, passLinger); err != nil {
		return err
	}
	rt.beat = time.Now()
	rt.unregisterSequencer = sync.OnceFunc(rt.telemetry.t.RegisterSequencer(func() observability.SequencerStatus {
		st := sequencer.Stats()
		return observability.SequencerStatus{BacklogSeconds: st.BacklogAge.Seconds(), Failing: int64(st.Failing),
			Stuck: st.Stuck, Batch: int64(st.Batch), Timeouts: st.Timeouts, Resets: st.Resets, Takeovers: st.Takeovers,
			Stranded: st.Stranded, ServerChanges: rt.store.Server().Epoch}
	}))
	if rt.replica != nil {
		replica := rt.replica
		rt.unregisterReplica = sync.OnceFunc(rt.telemetry.t.RegisterReplica(func() observability.ReplicaStatus {
			st := replica.Stats()
			return observability.ReplicaStatus{LagEvents: st.LagEvents, LagSeconds: st.Lag.Seconds(),
				FallingBack: st.FallingBack, StandbyReads: st.StandbyReads, PrimaryReads: st.PrimaryReads}
		}))
	}
	return nil
}

// sessionsFor returns the process's shared session connection for
// sessionURL, made on first use (see Runtime.sessions).
func (rt *Runtime) sessionsFor(sessionURL string) (*leasestore.Sessions, error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if ss, ok := rt.sessions[sessionURL]; ok {
		return ss, nil
	}
	ss, err := leasestore.NewSessions(rt.leasePool, rt.store.Schema(), sessionURL)
	if err != nil {
		return nil, err
	}
	if rt.sessions == nil {
		rt.sessions = map[string]*leasestore.Sessions{}
	}
	rt.sessions[sessionURL] = ss
	return ss, nil
}

// publishedIn is the publisher's position if it belongs to server epoch
// epoch, else 0 (nothing known of that epoch yet): positions of another
// server mean nothing on this one. The publisher stores a new epoch's
// position before the epoch, so once the epoch shows, so does a position
// of it.
func (rt *Runtime) publishedIn(epoch int64) int64 {
	if rt.publishedEpoch.Load() != epoch {
		return 0
	}
	return rt.published.Load()
}

// Migrate creates or upgrades everything kumi keeps in the store's schema:
// the event store's tables and the lease store's. It is idempotent, safe
// from several processes at once, and issues no DDL on an up-to-date
// schema. [Runtime.Start] calls it.
func Migrate(ctx context.Context, store *eventsource.Store) error {
	if err := store.Migrate(ctx); err != nil {
		return fmt.Errorf("kumi: migrate event store: %w", err)
	}
	if err := leasestore.Migrate(ctx, store.Pool(), store.Schema()); err != nil {
		return fmt.Errorf("kumi: migrate lease store: %w", err)
	}
	return nil
}

// ReadReplica returns the reads on RuntimeOptions.ReadPool (their lag and
// counts in its Stats), or nil without one.
func (rt *Runtime) ReadReplica() *eventsource.ReadReplica { return rt.replica }

// Store returns the runtime's event store.
func (rt *Runtime) Store() *eventsource.Store { return rt.store }

// Stop stops every group gracefully (see [Group.Stop]), all at once, then the publisher,
// notifier and sequencer, and waits for the actors' runs to end. It honours
// ctx throughout: when ctx ends first it returns ctx.Err() (joined with any
// other error) without waiting further; what could not be stopped in time —
// typically a handler blocked in a call that ignores its context — is
// logged and left running, and ends on its own when that call returns.
// Stop may be called again, to wait once more. It is safe before Start
// (the runtime then never starts) and from many goroutines.
func (rt *Runtime) Stop(ctx context.Context) error { return rt.life.Stop(ctx, rt.halt) }

func (rt *Runtime) halt(ctx context.Context) error {
	rt.mu.Lock()
	groups := make([]*Group, 0, len(rt.groups))
	for g := range rt.groups {
		groups = append(groups, g)
	}
	rt.mu.Unlock()
	// The groups stop together: a process of K groups stops in the time of
	// its slowest group, not in the sum of theirs, and a group whose
	// handler is stuck holds none of the others back
	// (TestRuntimeStopsItsGroupsTogether).
	errs := make([]error, len(groups), len(groups)+5)
	var wg sync.WaitGroup
	for i, g := range groups {
		wg.Go(func() { errs[i] = g.Stop(ctx) })
	}
	wg.Wait()
	errs = append(errs, rt.pub.Stop(ctx))
	// Every group has ended (or been cut loose by ctx, its lease calls
	// cancelled with its life): nothing holds a lease connection for long.
	rt.mu.Lock()
	for _, ss := range rt.sessions {
		ss.Close() // what a group cut loose still held is released with it
	}
	rt.mu.Unlock()
	rt.leasePool.Close()
	rt.listener.Close()
	errs = append(errs, rt.notifier.Stop(ctx))
	rt.unregisterSequencer()
	errs = append(errs, rt.sequencer.Stop(ctx))
	rt.unregisterReplica()
	if rt.replica != nil {
		errs = append(errs, rt.replica.Stop(ctx))
	}
	if busy, err := rt.dispatcher.close(ctx); err != nil {
		rt.logger.Warn("kumi: runtime stop: actors still running when the deadline came; left running "+
			"(a handler blocked in a call that ignores its context ends only when that call returns)",
			"running", busy, "err", err)
		errs = append(errs, err)
	}
	return joinDistinct(errs...)
}

// joinDistinct joins the errors, each once: a group that ended on an error
// returns it again from its Stop, and every step of a stop that ran out of
// time returns the same ctx.Err(); so errors.Is and the message stay plain.
func joinDistinct(errs ...error) error {
	var out []error
	for _, err := range errs {
		if err != nil && !slices.ContainsFunc(out, func(e error) bool { return errors.Is(e, err) }) {
			out = append(out, err)
		}
	}
	if len(out) == 1 {
		return out[0]
	}
	return errors.Join(out...)
}

// stopActor stops pid (its children first) and waits until it has
// terminated or ctx ends, then returning ctx.Err(). Unlike protoactor's
// StopFuture, whose wait is a fixed 10 s, the wait is the caller's.
func stopActor(ctx context.Context, system *actor.ActorSystem, pid *actor.PID) error {
	terminated := make(chan struct{})
	watcher := system.Root.Spawn(actor.PropsFromFunc(func(c actor.Context) {
		switch m := c.Message().(type) {
		case *actor.Started:
			c.Watch(pid) // a pid already gone answers Terminated at once
		case *actor.Terminated:
			if m.Who.Equal(pid) {
				close(terminated)
				c.Stop(c.Self())
			}
		}
	}))
	system.Root.Stop(pid)
	select {
	case <-terminated:
		return nil
	case <-ctx.Done():
		system.Root.Stop(watcher)
		return ctx.Err()
	}
}
