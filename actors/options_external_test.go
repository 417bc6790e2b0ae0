package actors_test

import (
	"context"
	"log/slog"
	"net"
	"reflect"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// requireEverySet fails unless every exported field of the struct v, and of
// the structs among its fields, is set: a field added later without a
// value here fails the test.
func requireEverySet(t *testing.T, v any, path string) {
	t.Helper()
	rv := reflect.ValueOf(v)
	for i := range rv.NumField() {
		f, fv := rv.Type().Field(i), rv.Field(i)
		if !f.IsExported() {
			continue
		}
		if fv.Kind() == reflect.Struct {
			requireEverySet(t, fv.Interface(), path+"."+f.Name)
			continue
		}
		require.False(t, fv.IsZero(), "%s.%s is not set", path, f.Name)
	}
}

// Every option of the public API can be set from another module: this
// package names no internal package for them, sets each one, and runs a
// group with them against the real database.
func TestEveryOptionIsSettableFromOutside(t *testing.T) {
	t.Parallel()
	logger := slog.New(slog.DiscardHandler)
	pool := pgtest.NewPool(t, 12)
	store, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	handled := make(chan struct{}, 1)

	policy, err := actors.ParseOverflowPolicy("drop-oldest")
	require.NoError(t, err)
	require.Equal(t, actors.DropOldest, policy)
	for _, p := range []actors.OverflowPolicy{actors.PauseAndResume, actors.DropSubscription, actors.DropOldest} {
		back, err := actors.ParseOverflowPolicy(p.String())
		require.NoError(t, err)
		require.Equal(t, p, back)
	}

	group := actors.GroupOptions{
		Subscription: "outside",
		Category:     "acct",
		Buckets:      4,
		Handler: actors.Func(func(ctx context.Context, d *actors.Delivery) error {
			select {
			case handled <- struct{}{}:
			default:
			}
			return nil
		}),
		Worker: "w-outside",
		Lease: leasestore.LeaseOptions{
			Kind:       leasestore.KindSession,
			TTL:        4 * time.Second,
			Heartbeat:  time.Second,
			Margin:     time.Second,
			SessionURL: pgtest.URL(t),
			NoListen:   true,
		},
		Retry: actors.RetryPolicy{
			MaxAttempts: 3,
			Backoff: supervision.Backoff{
				Initial: time.Millisecond, Max: 10 * time.Millisecond, Multiplier: 3,
				Jitter: supervision.EqualJitter, Rand: func() float64 { return 0.5 },
			},
		},
		BatchSize:          100,
		QueueCapacity:      16,
		QueueBytes:         1 << 20,
		Overflow:           policy,
		MaxInFlight:        1, // Batch needs 1
		OnDeadLetter:       actors.ParkStream,
		HandlerTimeout:     5 * time.Second,
		CheckpointEvery:    10,
		CheckpointInterval: 50 * time.Millisecond,
		DatabaseTimeout:    10 * time.Second,
		Logger:             logger,
		Batch:              actors.BatchOptions{MaxEvents: 10, MaxBytes: 1 << 20},
	}
	var started bool
	run := actors.RunOptions{
		Runtime: actors.RuntimeOptions{
			Logger:         logger,
			Telemetry:      observability.New(observability.Options{Logger: logger}),
			PollInterval:   100 * time.Millisecond,
			Sequencer:      eventsource.SequencerOptions{MinInterval: time.Millisecond, MaxInterval: 20 * time.Millisecond, IdleInterval: 500 * time.Millisecond, Logger: logger},
			Supervision:    supervision.ObserverFunc(func(supervision.Decision) {}),
			QueueBytes:     32 << 20,
			LeasePoolConns: 3,
			// The primary as its own read pool: every page it reads covers
			// the head its reader knows, so the read path runs as on a
			// standby that is never behind.
			ReadPool: pgtest.NewPool(t, 4),
			ReadReplica: eventsource.ReadReplicaOptions{Wait: 500 * time.Millisecond, LagInterval: 100 * time.Millisecond,
				WarnLag: 10 * time.Second, FallbackLag: 20 * time.Second, Logger: logger},
		},
		System:      actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(logger))),
		StopTimeout: 20 * time.Second,
		Started:     func(*actors.Runtime, []*actors.Group) { started = true },
		Serve:       "127.0.0.1:0",
		Serving:     func(net.Addr) {},
	}
	requireEverySet(t, group, "GroupOptions")
	requireEverySet(t, run, "RunOptions")

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- actors.Run(ctx, store, run, group) }()
	pgtest.Eventually(t, time.Minute, func() bool {
		_, err := store.Append(ctx, "acct-1", eventsource.Any, []eventsource.EventData{{Type: "Opened", Data: []byte(`{}`)}})
		return err == nil
	}, "the runtime has migrated the store")
	<-handled
	cancel()
	require.NoError(t, <-done)
	require.True(t, started)
}
