package actors

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestOneListenSessionPerProcess runs a Runtime with two groups (one of
// each lease kind) on a pool whose sessions carry an application_name of
// their own, and counts the process's sessions in pg_stat_activity: one
// LISTEN session (the runtime's notifier, which also wakes both lease
// stores), besides the session kind's dedicated session, which is no
// LISTEN.
func TestOneListenSessionPerProcess(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, schema := newTestStore(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	app := "kumi_listen_" + hex.EncodeToString(b[:])
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = 12
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := startedRuntime(ctx, quietSystem(), store, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	t.Cleanup(func() {
		stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		require.NoError(t, rt.Stop(stopCtx))
	})
	rec := newRecorder()
	rows := groupOpts("listen-rows", 2, rec, "w")
	sessions := groupOpts("listen-sessions", 2, rec, "w")
	sessions.Lease.Kind = leasestore.KindSession
	var groups []*Group
	for _, opts := range []GroupOptions{rows, sessions} {
		g, err := rt.StartGroup(ctx, opts)
		require.NoError(t, err)
		groups = append(groups, g)
	}
	// The runtime's notifier listens on both lease channels: a notification
	// on each reaches it.
	for i, sub := range []string{"listen-rows", "listen-sessions"} {
		ch := leasestore.ChannelName(schema, sub)
		want := int64(100 + i)
		pgtest.Eventually(t, waitLong, func() bool {
			_, err := pool.Exec(ctx, "SELECT pg_notify($1, $2::bigint::text)", ch, want)
			require.NoError(t, err)
			return rt.notifier.Latest(ch) == want
		}, "the runtime's notifier hears %s's lease channel", sub)
	}

	count := func(query string, args ...any) int {
		var n int
		require.NoError(t, pgtest.Pool(t).QueryRow(ctx, query, args...).Scan(&n))
		return n
	}
	require.Equal(t, 1, count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`, app),
		"one LISTEN session for the runtime and both groups")
	require.Equal(t, int64(1), rt.notifier.Stats().Connects, "channels were added without reconnecting")

	snap, err := groups[1].g.leases.Snapshot(ctx)
	require.NoError(t, err)
	require.Len(t, snap.Workers, 1)
	require.Equal(t, 1, count(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND pid = $2
		AND query NOT LIKE 'LISTEN %'`, app, snap.Workers[0].BackendPID),
		"the session kind's dedicated session is there, and is no LISTEN")
}
