package worker

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/dburl"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/observability/otelsetup"
)

// Config configures a worker process.
type Config struct {
	DatabaseURL  string
	Schema       string
	Subscription string
	// Subscriptions is how many subscriptions of Category the worker runs
	// (default 1): with more than one, they are named Subscription-1 …
	// Subscription-N, one group each on the process's one runtime.
	Subscriptions int
	Category      string
	Buckets       int
	Worker        string
	LeaseKind     leasestore.Kind
	TTL           time.Duration
	Heartbeat     time.Duration
	Margin        time.Duration
	// HandlerDelay makes the handler slow (per event).
	HandlerDelay time.Duration
	// Exactly commits the sink row and the checkpoint together.
	Exactly bool
	// QueueCapacity bounds the readers' queues (0: default).
	QueueCapacity int
	// QueueBytes and ProcessQueueBytes are GroupOptions.QueueBytes and
	// RuntimeOptions.QueueBytes (0: default).
	QueueBytes, ProcessQueueBytes int64
	// PoolConns sizes the worker's connection pool (0: 8).
	PoolConns int
	// BatchSize, Overflow, HandlerTimeout and MaxAttempts are the group's
	// options of the same names (zero: kumi's defaults).
	BatchSize      int
	Overflow       overflow.Policy
	HandlerTimeout time.Duration
	MaxAttempts    int
	// SlowTx, with Exactly: the first attempt at every SlowTxEvery-th event
	// (by position) keeps its transaction open for SlowTx after its write,
	// past the delivery's cancellation (a lock wait in a handler that does
	// not watch its context).
	SlowTx      time.Duration
	SlowTxEvery int
	// PoisonType: the handler panics on every delivery of events of this
	// type, so they end as dead letters.
	PoisonType string
	// HangType: the handler blocks on events of this type, ignoring the
	// delivery's context, until the worker stops: a hung handler.
	HangType string
	// NoListen turns off the lease store's LISTEN connection, as behind a
	// transaction pooler (leasestore.LeaseOptions.NoListen).
	NoListen bool
	// ReadURL, when set, is a hot standby of the database: the readers'
	// catch-up pages and the publisher's reads go there
	// (actors.RuntimeOptions.ReadPool). ReplicaWait and ReplicaFallbackLag
	// are eventsource.ReadReplicaOptions' Wait and FallbackLag.
	ReadURL                         string
	ReplicaWait, ReplicaFallbackLag time.Duration
	// MetricsAddr, when set, serves /metrics, /healthz and /status.
	MetricsAddr string
	// MetricsToken, when set (default $KUMI_METRICS_TOKEN), is the bearer
	// token those endpoints require (observability.HandlerOptions.Token).
	MetricsToken string
	// Quiet silences the logs; Verbose logs at Debug.
	Quiet, Verbose bool
}

// ParseFlags reads a worker's configuration from command-line arguments,
// with DATABASE_URL as the default database. The URL is read from the
// environment after parsing, never made a flag's default: the usage text
// prints defaults, and the URL's password with them.
func ParseFlags(args []string, stderr io.Writer) (Config, error) {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := Config{}
	var kind string
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL (default $DATABASE_URL; on the command line ps shows its password)")
	fs.StringVar(&c.Schema, "schema", "kumi", "schema of the event store")
	fs.StringVar(&c.Subscription, "subscription", "demo", "subscription name")
	fs.IntVar(&c.Subscriptions, "subscriptions", 1, "how many subscriptions of the category to run (more than 1: named <subscription>-1 … -N)")
	fs.StringVar(&c.Category, "category", "account", "category to handle")
	fs.IntVar(&c.Buckets, "buckets", 16, "number of buckets")
	fs.StringVar(&c.Worker, "worker", "", "worker id (default: a fresh one)")
	fs.StringVar(&kind, "lease", "row", "lease kind: row or session")
	fs.DurationVar(&c.TTL, "ttl", 3*time.Second, "lease ttl")
	fs.DurationVar(&c.Heartbeat, "heartbeat", 500*time.Millisecond, "lease heartbeat and reconcile interval")
	fs.DurationVar(&c.Margin, "margin", time.Second, "lease margin")
	fs.DurationVar(&c.HandlerDelay, "handler-delay", 0, "time the handler takes per event")
	fs.BoolVar(&c.Exactly, "exactly-once", false, "commit the sink row and the checkpoint in one fenced transaction")
	fs.IntVar(&c.QueueCapacity, "queue-capacity", 0, "reader queue capacity in batches (0: default)")
	fs.Int64Var(&c.QueueBytes, "queue-bytes", 0, "each reader's byte bound (0: default, 8 MiB)")
	fs.Int64Var(&c.ProcessQueueBytes, "process-queue-bytes", 0, "the byte bound of every reader queue of the process together (0: default, 256 MiB)")
	fs.IntVar(&c.PoolConns, "pool-conns", 8, "connections in the worker's pool (the process's lease pool adds its own)")
	fs.IntVar(&c.BatchSize, "batch-size", 0, "reader catch-up page size (0: default)")
	var policy string
	fs.StringVar(&policy, "overflow", "pause_and_resume", "reader queue overflow policy: pause_and_resume, drop_subscription or drop_oldest")
	fs.DurationVar(&c.HandlerTimeout, "handler-timeout", 0, "how long a handler may take to answer (0: default)")
	fs.IntVar(&c.MaxAttempts, "max-attempts", 0, "deliveries of an event before it is dead-lettered (0: default)")
	fs.DurationVar(&c.SlowTx, "slow-tx", 0, "with -exactly-once: the first attempt at every -slow-tx-every-th event keeps its transaction open this long, ignoring the delivery's cancellation")
	fs.IntVar(&c.SlowTxEvery, "slow-tx-every", 10, "which events -slow-tx slows: those whose position is a multiple of this")
	fs.StringVar(&c.PoisonType, "poison-type", "", "the handler panics on every delivery of events of this type")
	fs.StringVar(&c.HangType, "hang-type", "", "the handler blocks on events of this type, ignoring the delivery's context, until the worker stops")
	fs.BoolVar(&c.NoListen, "no-listen", false, "no LISTEN for lease changes (behind a transaction pooler)")
	fs.StringVar(&c.ReadURL, "read-url", "", "PostgreSQL URL of a hot standby of the database: catch-up and publisher reads go there (default: none)")
	fs.DurationVar(&c.ReplicaWait, "replica-wait", 0, "with -read-url: how long a read waits for the standby before reading the primary (0: default, 1s)")
	fs.DurationVar(&c.ReplicaFallbackLag, "replica-fallback-lag", 0, "with -read-url: read on the primary while the standby lags more than this (0: never)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "serve /metrics, /healthz and /status here (e.g. 127.0.0.1:9464; "+
		"$KUMI_METRICS_TOKEN, when set, is the bearer token they require)")
	fs.BoolVar(&c.Quiet, "quiet", false, "no logs")
	fs.BoolVar(&c.Verbose, "v", false, "debug logs")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	if c.DatabaseURL == "" {
		c.DatabaseURL = os.Getenv("DATABASE_URL")
	}
	c.MetricsToken = os.Getenv("KUMI_METRICS_TOKEN")
	switch kind {
	case "row":
		c.LeaseKind = leasestore.KindRow
	case "session":
		c.LeaseKind = leasestore.KindSession
	default:
		return c, fmt.Errorf("-lease %q: use row or session", kind)
	}
	p, err := overflow.ParsePolicy(policy)
	if err != nil {
		return c, fmt.Errorf("-overflow: %w", err)
	}
	c.Overflow = p
	if c.SlowTxEvery < 1 {
		return c, fmt.Errorf("-slow-tx-every %d: it must be at least 1", c.SlowTxEvery)
	}
	if c.SlowTx > 0 && !c.Exactly {
		return c, errors.New("-slow-tx needs -exactly-once: it slows the exactly-once transaction")
	}
	if c.DatabaseURL == "" {
		return c, errors.New("no database: pass -database-url or set DATABASE_URL")
	}
	if c.Subscriptions < 1 || c.Subscriptions > 1000 {
		return c, fmt.Errorf("-subscriptions %d: use 1 to 1000", c.Subscriptions)
	}
	if c.PoolConns < 1 || c.PoolConns > 1000 {
		return c, fmt.Errorf("-pool-conns %d: use 1 to 1000", c.PoolConns)
	}
	return c, nil
}

// SubscriptionNames are the subscriptions the worker runs: Subscription
// alone, or Subscription-1 … Subscription-N with Subscriptions N > 1.
func (c Config) SubscriptionNames() []string {
	if c.Subscriptions <= 1 {
		return []string{c.Subscription}
	}
	names := make([]string, c.Subscriptions)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", c.Subscription, i+1)
	}
	return names
}

// SinkDDL creates the sink table in schema.
func SinkDDL(schema string) string {
	q := pgx.Identifier{schema}.Sanitize()
	return `CREATE TABLE IF NOT EXISTS ` + q + `.sink (
  subscription text NOT NULL,
  event_id uuid NOT NULL,
  position bigint NOT NULL,
  stream text NOT NULL,
  version bigint NOT NULL,
  worker text NOT NULL,
  deliveries int NOT NULL DEFAULT 1,
  first_at timestamptz NOT NULL DEFAULT clock_timestamp(),
  PRIMARY KEY (subscription, event_id))`
}

// Run runs a worker until ctx ends or a SIGTERM/SIGINT arrives, then stops
// it gracefully.
func Run(ctx context.Context, c Config) error {
	level := slog.LevelInfo
	if c.Verbose {
		level = slog.LevelDebug
	}
	var logger *slog.Logger
	if c.Quiet {
		logger = slog.New(slog.DiscardHandler)
	} else {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	shutdown, err := otelsetup.Setup(ctx, otelsetup.Options{ServiceName: "kumi-worker", Logger: logger})
	if err != nil {
		return err
	}
	defer func() { _ = shutdown(context.Background()) }()

	pcfg, err := dburl.Parse(c.DatabaseURL)
	if err != nil {
		return err
	}
	pcfg.MaxConns = int32(cmp.Or(c.PoolConns, 8))
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return dburl.RedactError(c.DatabaseURL, err)
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: c.Schema})
	if err != nil {
		return err
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(logger)))
	tel := observability.New(observability.Options{Logger: logger})
	defer func() { _ = tel.Close() }()
	ro := actors.RuntimeOptions{Logger: logger, Telemetry: tel, QueueBytes: c.ProcessQueueBytes,
		ReadReplica: eventsource.ReadReplicaOptions{Wait: c.ReplicaWait, FallbackLag: c.ReplicaFallbackLag}}
	if c.ReadURL != "" {
		rcfg, err := dburl.Parse(c.ReadURL)
		if err != nil {
			return fmt.Errorf("-read-url: %w", err)
		}
		rcfg.MaxConns = pcfg.MaxConns
		if ro.ReadPool, err = pgxpool.NewWithConfig(ctx, rcfg); err != nil {
			return dburl.RedactError(c.ReadURL, err)
		}
		defer ro.ReadPool.Close()
	}
	rt, err := actors.New(system, store, ro)
	if err != nil {
		return err
	}
	if err := rt.Start(ctx); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, SinkDDL(c.Schema)); err != nil {
		_ = rt.Stop(context.Background())
		return err
	}
	if c.Worker == "" {
		c.Worker = fmt.Sprintf("w-%d-%s", os.Getpid(), uuid.NewString()[:4])
	}
	worker := c.Worker
	lease := leasestore.LeaseOptions{Kind: c.LeaseKind, TTL: c.TTL, Heartbeat: c.Heartbeat, Margin: c.Margin,
		NoListen: c.NoListen}
	// done is closed when the first of the groups ends.
	done := make(chan struct{})
	var once sync.Once
	for _, sub := range c.SubscriptionNames() {
		group, err := rt.StartGroup(ctx, actors.GroupOptions{
			Subscription: sub, Category: c.Category, Buckets: c.Buckets, Worker: worker,
			Handler:        sinkHandler(ctx, store, c),
			QueueCapacity:  c.QueueCapacity,
			QueueBytes:     c.QueueBytes,
			BatchSize:      c.BatchSize,
			Overflow:       c.Overflow,
			HandlerTimeout: c.HandlerTimeout,
			Retry:          actors.RetryPolicy{MaxAttempts: c.MaxAttempts},
			Lease:          lease,
		})
		if err != nil {
			_ = rt.Stop(context.Background())
			return err
		}
		go func() {
			select {
			case <-group.Done():
				once.Do(func() { close(done) })
			case <-ctx.Done():
			}
		}()
	}
	if c.MetricsAddr != "" {
		ln, err := net.Listen("tcp", c.MetricsAddr)
		if err != nil {
			_ = rt.Stop(context.Background())
			return err
		}
		go func() {
			_ = observability.ServeListener(ctx, ln, observability.Handler(observability.HandlerOptions{Telemetry: tel, Healthy: rt.Healthy,
				Token: c.MetricsToken}))
		}()
	}
	logger.Info("worker started", "worker", worker, "subscription", c.Subscription, "subscriptions", c.Subscriptions,
		"buckets", c.Buckets, "lease", c.LeaseKind.String())
	select {
	case <-ctx.Done():
	case <-done:
	}
	logger.Info("worker stopping", "worker", worker)
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return rt.Stop(sctx)
}

// sinkHandler records each delivery in the sink table. ctx is the
// worker's: a hung handler (HangType) returns when it ends.
func sinkHandler(ctx context.Context, store *eventsource.Store, c Config) *actor.Props {
	process := ctx
	q := pgx.Identifier{c.Schema}.Sanitize()
	upsert := `INSERT INTO ` + q + `.sink AS s (subscription, event_id, position, stream, version, worker)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (subscription, event_id) DO UPDATE SET deliveries = s.deliveries + 1`
	return actor.PropsFromFunc(func(ctx actor.Context) {
		d, ok := ctx.Message().(*actors.Delivery)
		if !ok {
			return
		}
		switch t := d.Event.Type; {
		case c.PoisonType != "" && t == c.PoisonType:
			panic(fmt.Sprintf("poison event %s", d.Event.ID))
		case c.HangType != "" && t == c.HangType:
			<-process.Done() // hung: deaf to the delivery's context
			return
		}
		if c.HandlerDelay > 0 {
			time.Sleep(c.HandlerDelay)
		}
		e := d.Event
		args := []any{d.Subscription, e.ID, e.Position, e.Stream, e.Version, c.Worker}
		cctx, cancel := context.WithTimeout(d.Context, 10*time.Second)
		defer cancel()
		if c.Exactly {
			slow := c.SlowTx > 0 && d.Attempt == 0 && e.Position%int64(c.SlowTxEvery) == 0
			if slow {
				// The transaction outlives the delivery: HandlerTimeout gives
				// up on it, and a retry runs while it is still open.
				cancel()
				cctx, cancel = context.WithTimeout(context.WithoutCancel(d.Context), c.SlowTx+10*time.Second)
				defer cancel()
			}
			err := actors.CommitWithCheckpoint(cctx, store, d, func(ctx context.Context, tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, upsert, args...); err != nil {
					return err
				}
				if slow {
					_, err := tx.Exec(ctx, `SELECT pg_sleep($1)`, c.SlowTx.Seconds())
					return err
				}
				return nil
			})
			switch {
			case errors.Is(err, actors.ErrAlreadyCommitted):
				ctx.Respond(actors.Ack{Committed: true}) // an earlier attempt committed it
			case errors.Is(err, eventsource.ErrFenceLost):
				ctx.Respond(actors.Ack{}) // the new owner redoes it
			case err != nil:
				ctx.Respond(actors.Retry{Reason: err.Error()})
			default:
				ctx.Respond(actors.Ack{Committed: true})
			}
			return
		}
		if _, err := store.Pool().Exec(cctx, upsert, args...); err != nil {
			ctx.Respond(actors.Retry{Reason: err.Error()})
			return
		}
		ctx.Respond(actors.Ack{})
	})
}
