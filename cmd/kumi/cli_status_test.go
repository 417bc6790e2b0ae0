package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 4
	evs := b.appendEvents(t, "account", 10, 40)
	a := b.lease(t, "balances", "worker-a", n)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, n)
	// Bucket 1 has handled everything up to the 10th event.
	_, err = b.store.SaveCheckpoint(ctx, "balances", 1, evs[9].Position, a.Fence(1, res.Owned[1].Epoch))
	require.NoError(t, err)
	wantLag := map[int]int64{}
	for _, e := range evs {
		if bk := e.Bucket(n); bk != 1 || e.Position > evs[9].Position {
			wantLag[bk]++
		}
	}

	t.Run("TableShowsWorkersOwnersAndLag", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "-c", "account")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, `subscription "balances" in schema "`+b.schema+`": 4 buckets, 4 held, 1 live worker, head position 40`)
		require.Regexp(t, `(?m)^worker-a\s+row\s+yes\s+\S+ ago\s+in \S+\s+4$`, r.stdout)
		require.Regexp(t, `(?m)^1\s+worker-a\s+1\s+in \S+\s+-\s+`+itoa(int(evs[9].Position))+`\s+`+itoa(int(wantLag[1]))+`\b`, r.stdout)
	})
	t.Run("JSONHasEveryField", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "-c", "account", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		st := decode[statusOut](t, r.stdout)
		require.Equal(t, "balances", st.Subscription)
		require.Equal(t, n, st.BucketCount)
		require.EqualValues(t, 40, st.Head)
		require.Len(t, st.Workers, 1)
		require.True(t, st.Workers[0].Live)
		require.Equal(t, n, st.Workers[0].Owns)
		require.Len(t, st.Buckets, n)
		for _, bk := range st.Buckets {
			require.Equal(t, "worker-a", bk.Owner)
			require.EqualValues(t, 1, bk.Epoch)
			require.NotNil(t, bk.ExpiresInSeconds)
			require.Greater(t, *bk.ExpiresInSeconds, 0.0)
			require.NotNil(t, bk.Lag)
			require.Equal(t, wantLag[bk.Bucket], *bk.Lag, "bucket %d", bk.Bucket)
		}
		require.Equal(t, evs[9].Position, st.Buckets[1].Checkpoint)
	})
	t.Run("AMistypedCategoryIsRefused", func(t *testing.T) {
		t.Parallel()
		// "accounts" has no events, and balances has handled some of
		// "account": its lag would read 0 everywhere, all caught up.
		r := b.run(t, "status", "-s", "balances", "-c", "accounts")
		require.Equal(t, exitUsage, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		require.Contains(t, r.stderr, `category "accounts" has no events, yet subscription "balances" has handled events up to position `+
			itoa(int(evs[9].Position))+`: it is not the subscription's category (categories with events: account)`)
		require.Empty(t, r.stdout)
	})
	t.Run("ACategoryWithNoEventsIsWarnedOfBeforeAnyIsHandled", func(t *testing.T) {
		t.Parallel()
		fresh := b.lease(t, "fresh", "worker-f", 2)
		_, err := fresh.Pass(ctx)
		require.NoError(t, err)
		r := b.run(t, "status", "-s", "fresh", "-c", "accounts")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, `warning: category "accounts" has no events: a lag of 0 means nothing to read; `+
			`check it is the subscription's (categories with events: account)`)
		r = b.run(t, "status", "-s", "fresh", "-c", "accounts", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		st := decode[statusOut](t, r.stdout)
		require.True(t, st.CategoryEmpty)
		require.Equal(t, []string{"account"}, st.Categories)
		r = b.run(t, "status", "-s", "fresh", "-c", "account")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.NotContains(t, r.stdout, "warning")
	})
	t.Run("WithoutCategoryLagIsUnknown", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		for _, bk := range decode[statusOut](t, r.stdout).Buckets {
			require.Nil(t, bk.Lag)
		}
	})
	t.Run("OverviewListsSubscriptions", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Regexp(t, `(?m)^balances\s+4\s+4\s+1\s+1\s+0$`, r.stdout)
		r = b.run(t, "status", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, `"subscription": "balances"`)
	})
	t.Run("UnknownSubscriptionIsAnError", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "nope")
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, `subscription "nope" has no buckets`)
	})
	t.Run("StatusJoinsNoPool", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Len(t, decode[statusOut](t, r.stdout).Workers, 1, "status must not register itself as a worker")
	})
}

// A failover that handed positions out again is recorded (eventsource's
// TestFailover promotes a real standby; here the record's own function
// stands in for the finders), and status warns of it until it is a week
// old; --failovers prints the record.
func TestStatusWarnsOfAFailoverThatReusedPositions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.run(t, "status", "--failovers")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "has recorded no change of server")

	note := `SELECT ` + b.store.QuotedSchema() + `.note_server_change($1, '7', 1, '7', 2, $2, $3)`
	_, err := b.store.Pool().Exec(ctx, note, "timeline", int64(70), int64(10))
	require.NoError(t, err)
	_, err = b.store.Pool().Exec(ctx, note, "timeline", int64(72), int64(12)) // a second finder
	require.NoError(t, err)

	r = b.run(t, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "warning: ")
	require.Contains(t, r.stdout, "the server changed (timeline: 7/1 → 7/2)")
	require.Contains(t, r.stdout, "positions 11 to 72 were handed out again")

	r = b.run(t, "status", "--failovers", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	rec := decode[[]eventsource.RecordedServerChange](t, r.stdout)
	require.Len(t, rec, 1, "one failover, however many found it")
	require.EqualValues(t, 72, rec[0].HeadBefore)
	require.EqualValues(t, 10, rec[0].HeadAfter)
	require.Equal(t, 2, rec[0].Reports)

	r = b.run(t, "status", "--failovers", "-s", "balances")
	require.Equal(t, exitUsage, r.code)
}
