package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
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
	b, r := setupStandby(t, func(b *bundle, primary string) {
		b.appendEvents(t, "account", 3, 12)
		ls, err := leasestore.New(b.store.Pool(), leasestore.Config{Schema: b.schema, Subscription: "balances",
			Worker: "worker-s", Buckets: 2, LeaseOptions: leasestore.LeaseOptions{Kind: leasestore.KindSession, SessionURL: primary, NoListen: true}})
		if err == nil {
			err = ls.Start(ctx)
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = ls.Stop(context.Background()) })
		_, err = ls.Pass(ctx)
		require.NoError(t, err)
	})

	onStandby := kumi(t, []string{"DATABASE_URL=" + r.URL, "KUMI_SCHEMA=" + b.schema}, "status", "-s", "balances")
	require.Equal(t, exitOK, onStandby.code, onStandby.stderr)
	require.NotContains(t, onStandby.stdout, "session gone", "the standby cannot see the primary's advisory locks")
	require.Regexp(t, `(?m)^worker-s\s+session\s+unknown`, onStandby.stdout)
	require.Contains(t, onStandby.stdout, "read on a hot standby")

	pauseReplay(t, r)
	b.appendEvents(t, "account", 3, 5)
	both := b.run(t, "status", "-s", "balances", "-c", "account", "--read-url", r.URL, "--json")
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
}

// TestStatusOverviewReadsOnTheReplica: `kumi status --read-url URL`
// without -s (docs/operations.md: it "shows the standby's head, the events
// and WAL bytes it is behind") counts the checkpoints and dead letters on
// the standby, as of its replay, reads the leases on the primary, and
// shows how far behind the standby is; a --read-url that is no standby
// is refused, as with -s.
func TestStatusOverviewReadsOnTheReplica(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var evs []eventsource.RecordedEvent
	letter := func(b *bundle, e eventsource.RecordedEvent) {
		_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "balances", Bucket: 0,
			EventID: e.ID, Reason: "boom", Attempts: 1})
		require.NoError(t, err)
	}
	b, r := setupStandby(t, func(b *bundle, _ string) {
		evs = b.appendEvents(t, "account", 3, 12)
		settle := b.lease(t, "balances", "worker-a", 2)
		_, err := settle.Pass(ctx)
		require.NoError(t, err)
		letter(b, evs[0])
	})
	pauseReplay(t, r)
	b.appendEvents(t, "account", 3, 3)
	letter(b, evs[1])
	letter(b, evs[2])

	res := b.run(t, "status", "--read-url", r.URL)
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Regexp(t, `(?m)^balances\s+2\s+2\s+1\s+0\s+1$`, res.stdout,
		"leases from the primary (2 held, 1 live worker), 1 dead letter as of the standby's replay")
	require.Contains(t, res.stdout, "read replica: head position 12, 3 events behind the primary's 15")
	require.Contains(t, res.stdout, "replay paused")

	res = b.run(t, "status", "--read-url", r.URL, "--json")
	require.Equal(t, exitOK, res.code, res.stderr)
	ov := decode[overviewOut](t, res.stdout)
	require.Len(t, ov.Subscriptions, 1)
	require.Equal(t, 1, ov.Subscriptions[0].DeadLetters)
	require.Equal(t, 2, ov.Subscriptions[0].Held)
	require.NotNil(t, ov.ReadReplica)
	require.EqualValues(t, 3, ov.ReadReplica.LagEvents)
	require.True(t, ov.ReadReplica.ReplayPaused)

	res = b.run(t, "status")
	require.Equal(t, exitOK, res.code, res.stderr)
	require.Regexp(t, `(?m)^balances\s+2\s+2\s+1\s+0\s+3$`, res.stdout, "without --read-url: the primary's count")

	primary := b.env[0][len("DATABASE_URL="):]
	res = b.run(t, "status", "--read-url", primary)
	require.Equal(t, exitRuntime, res.code, res.stdout)
	require.Contains(t, res.stderr, "--read-url: the read database is not a hot standby")
}
