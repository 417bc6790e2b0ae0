package eventsource_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
)

// Every invalid option of the store's constructors is refused before the
// database is touched, with a *kumierr.ConfigError naming the field.
func TestEveryInvalidFieldIsRefusedByName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	pool := s.Pool()
	probe := func(context.Context) (int64, error) { return 0, nil }
	for _, c := range []struct {
		field string
		call  func() error
	}{
		{"eventsource pool", func() error { _, err := eventsource.New(nil, eventsource.Config{}); return err }},
		{"eventsource.Config.Schema", newStoreWith(pool, eventsource.Config{Schema: "pg_catalog"})},
		{"eventsource.Config.MaxEventSize", newStoreWith(pool, eventsource.Config{MaxEventSize: -1})},
		{"eventsource.Config.MaxEventSize", newStoreWith(pool, eventsource.Config{MaxEventSize: eventsource.MaxBatchBytesLimit + 1})},
		{"eventsource.Config.MaxBatchEvents", newStoreWith(pool, eventsource.Config{MaxBatchEvents: -1})},
		{"eventsource.Config.MaxBatchBytes", newStoreWith(pool, eventsource.Config{MaxEventSize: 1 << 20, MaxBatchBytes: 1 << 10})},
		{"eventsource pool", func() error {
			_, err := eventsource.NewNotifier(nil, eventsource.NotifierOptions{Channels: []string{"a"}})
			return err
		}},
		{"eventsource.NotifierOptions.Channels", newNotifierWith(pool, eventsource.NotifierOptions{})},
		{"eventsource.NotifierOptions.Channels", newNotifierWith(pool, eventsource.NotifierOptions{Channels: []string{"a\x00b"}})},
		{"eventsource.NotifierOptions.Probes", newNotifierWith(pool, eventsource.NotifierOptions{Channels: []string{"a"},
			Probes: map[string]eventsource.Probe{"b": probe}})},
		{"eventsource.NotifierOptions.Probes", newNotifierWith(pool, eventsource.NotifierOptions{Channels: []string{"a"},
			Probes: map[string]eventsource.Probe{"a": nil}})},
		{"eventsource.NotifierOptions.ReconnectMax", newNotifierWith(pool, eventsource.NotifierOptions{Channels: []string{"a"},
			ReconnectMin: time.Second, ReconnectMax: time.Millisecond})},
		{"eventsource primary", func() error {
			_, err := eventsource.NewReadReplica(nil, pool, eventsource.ReadReplicaOptions{})
			return err
		}},
		{"eventsource standby", newReplicaWith(s, nil, eventsource.ReadReplicaOptions{})},
		{"eventsource.ReadReplicaOptions.Wait", newReplicaWith(s, pool, eventsource.ReadReplicaOptions{Wait: -time.Second})},
		{"eventsource.ReadReplicaOptions.LagInterval", newReplicaWith(s, pool, eventsource.ReadReplicaOptions{LagInterval: 2 * time.Hour})},
		{"eventsource.ReadReplicaOptions.FallbackLag", newReplicaWith(s, pool, eventsource.ReadReplicaOptions{FallbackLag: -1})},
		{"eventsource group size", func() error { return s.EnsureConsumerGroupIndex(ctx, 0) }},
		{"eventsource handler", func() error {
			_, err := s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, nil)
			return err
		}},
	} {
		var ce *kumierr.ConfigError
		require.ErrorAs(t, c.call(), &ce, c.field)
		require.Equal(t, c.field, ce.Field)
		require.NotEmpty(t, ce.Reason, c.field)
	}
}

func newStoreWith(pool *pgxpool.Pool, cfg eventsource.Config) func() error {
	return func() error { _, err := eventsource.New(pool, cfg); return err }
}

func newNotifierWith(pool *pgxpool.Pool, o eventsource.NotifierOptions) func() error {
	return func() error { _, err := eventsource.NewNotifier(pool, o); return err }
}

func newReplicaWith(s *eventsource.Store, standby *pgxpool.Pool, o eventsource.ReadReplicaOptions) func() error {
	return func() error { _, err := eventsource.NewReadReplica(s, standby, o); return err }
}
