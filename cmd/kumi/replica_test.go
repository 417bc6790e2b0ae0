package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestStatusOnAReplica: `kumi status` pointed at a hot standby of the
// database (--database-url) shows a session-kind worker as live, not
// "session gone" (its advisory lock is held on the primary, where the
// standby's pg_locks cannot see it), and says it reads a standby; given
// the standby as --read-url instead, it reads the leases on the primary,
// counts the lag on the standby and shows how far behind the standby is.
func TestStatusOnAReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.LocalServer(t)
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pgtest.PoolOn(t, srv.URL, 4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, leasestore.Migrate(ctx, store.Pool(), schema))
	for i := range 12 {
		_, err := store.Append(ctx, fmt.Sprintf("account-%d", i%3), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(`{}`)}})
		require.NoError(t, err)
	}
	_, err = store.Sequence(ctx)
	require.NoError(t, err)
	ls, err := leasestore.New(ctx, store.Pool(), leasestore.Config{Schema: schema, Subscription: "balances",
		Worker: "worker-s", Buckets: 2, Kind: leasestore.KindSession, SessionURL: srv.URL, NoListen: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ls.Close() })
	_, err = ls.Pass(ctx)
	require.NoError(t, err)
	r := pgtest.NewReplica(t, srv)
	require.NoError(t, r.WaitReplayed(ctx))

	onStandby := kumi(t, []string{"DATABASE_URL=" + r.URL, "KUMI_SCHEMA=" + schema}, "status", "-s", "balances")
	require.Equal(t, exitOK, onStandby.code, onStandby.stderr)
	require.NotContains(t, onStandby.stdout, "session gone", "the standby cannot see the primary's advisory locks")
	require.Regexp(t, `(?m)^worker-s\s+session\s+unknown`, onStandby.stdout)
	require.Contains(t, onStandby.stdout, "read on a hot standby")

	require.NoError(t, r.PauseReplay(ctx))
	for i := range 5 {
		_, err := store.Append(ctx, fmt.Sprintf("account-%d", i%3), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(`{}`)}})
		require.NoError(t, err)
	}
	_, err = store.Sequence(ctx)
	require.NoError(t, err)
	both := kumi(t, []string{"DATABASE_URL=" + srv.URL, "KUMI_SCHEMA=" + schema},
		"status", "-s", "balances", "-c", "account", "--read-url", r.URL, "--json")
	require.Equal(t, exitOK, both.code, both.stderr)
	st := decode[statusOut](t, both.stdout)
	require.True(t, st.Workers[0].Live, "leases read on the primary")
	require.False(t, st.Workers[0].SessionGone)
	require.NotNil(t, st.ReadReplica)
	require.EqualValues(t, 17, st.ReadReplica.PrimaryHead)
	require.EqualValues(t, 12, st.ReadReplica.StandbyHead)
	require.EqualValues(t, 5, st.ReadReplica.LagEvents)
	require.True(t, st.ReadReplica.ReplayPaused)
	var lag int64
	for _, b := range st.Buckets {
		lag += *b.Lag
	}
	require.EqualValues(t, 12, lag, "the lag was counted on the standby, as of its replay")
	require.NoError(t, r.ResumeReplay(ctx))
}
