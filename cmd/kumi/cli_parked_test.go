package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

func TestParked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 4
	evs := b.appendEvents(t, "acct", 4, 16) // acct-0 … acct-3, 4 events each
	a := b.lease(t, "ledger", "worker-a", n)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, n)
	// The holder of each stream's bucket parks it, fenced by its lease.
	park := func(e eventsource.RecordedEvent, reason string) {
		t.Helper()
		bk := e.Bucket(n)
		_, err := b.store.ParkStream(ctx, eventsource.DeadLetter{Subscription: "ledger", Bucket: bk, EventID: e.ID,
			Reason: reason, Attempts: 5}, a.Fence(bk, res.Owned[bk].Epoch))
		require.NoError(t, err)
	}
	// evs[4*i+s] is acct-s's event of version i.
	park(evs[1*4+0], "no account\nsecond line") // acct-0 at version 1: 2 wait
	park(evs[0*4+1], "bad")                     // acct-1 at version 0: 3 wait
	park(evs[2*4+2], "skip me")                 // acct-2
	park(evs[0*4+3], "replay me")               // acct-3

	t.Run("StatusShowsParkedStreams", func(t *testing.T) {
		r := b.run(t, "status", "-s", "ledger")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Regexp(t, `(?m)^PARKED STREAM\s+BUCKET\s+WAITING\s+SINCE\s+STATE\s+REASON$`, r.stdout)
		require.Regexp(t, `(?m)^acct-0\s+`+itoa(evs[4].Bucket(n))+`\s+2\s+\S+ ago\s+parked\s+no account second line$`, r.stdout)
		r = b.run(t, "status", "-s", "ledger", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		st := decode[statusOut](t, r.stdout)
		require.Len(t, st.Parked, 4)
		p := st.Parked[1]
		require.Equal(t, "acct-1", p.Stream)
		require.NotNil(t, p.Bucket)
		require.Equal(t, evs[1].Bucket(n), *p.Bucket)
		require.EqualValues(t, 3, p.Waiting)
		require.Equal(t, evs[1].ID.String(), p.EventID)
		require.Equal(t, "bad", p.Reason)
		require.Empty(t, p.Action)
	})

	t.Run("ActionsAreGuardedAndRecorded", func(t *testing.T) {
		r := b.run(t, "parked", "skip", "-s", "ledger", "acct-2", "--confirm", "acct-9")
		require.Equal(t, exitUsage, r.code, r.stdout)
		require.Contains(t, r.stderr, `repeat the stream's name, "acct-2"`)
		r = b.run(t, "parked", "skip", "-s", "ledger", "acct-2")
		require.Equal(t, exitUsage, r.code, "--confirm is required")
		r = b.run(t, "parked", "replay", "-s", "ledger", "nodash")
		require.Equal(t, exitUsage, r.code, r.stderr)
		r = b.run(t, "parked", "replay", "-s", "nobody", "acct-3")
		require.Equal(t, exitRuntime, r.code, r.stderr)
		r = b.run(t, "parked", "replay", "-s", "ledger", "acct-7")
		require.Equal(t, exitRuntime, r.code, r.stderr)
		require.Contains(t, r.stderr, `has not parked stream "acct-7"`)

		r = b.run(t, "parked", "skip", "-s", "ledger", "acct-2", "--confirm", "acct-2")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "stream acct-2 is skipped for good")
		r = b.run(t, "parked", "replay", "-s", "ledger", "acct-3")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "asked to replay stream acct-3: the reader of its bucket delivers its 4 waiting events in order")
		r = b.run(t, "parked", "discard", "-s", "ledger", "acct-3")
		require.Equal(t, exitRuntime, r.code, "a stream being released takes no other action")
		require.Contains(t, r.stderr, "being released (replay)")
		r = b.run(t, "parked", "discard", "-s", "ledger", "acct-1")
		require.Equal(t, exitOK, r.code, r.stderr)
		_, err := b.store.DeadLetter(ctx, "ledger", evs[1].ID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound, "discard deleted the letter")

		r = b.run(t, "parked", "list", "-s", "ledger")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Regexp(t, `(?m)^acct-1\s+\d+\s+3\s+\S+\s+discard asked\s+`, r.stdout)
		require.Regexp(t, `(?m)^acct-2\s+\d+\s+1\s+\S+\s+skipped\s+`, r.stdout)
		require.Regexp(t, `(?m)^acct-3\s+\d+\s+4\s+\S+\s+replay asked\s+`, r.stdout)
		bk := evs[3].Bucket(n)
		r = b.run(t, "parked", "list", "-s", "ledger", "--bucket", itoa(bk), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		for _, p := range decode[[]parkedJSON](t, r.stdout) {
			require.Equal(t, bk, *p.Bucket)
		}
		r = b.run(t, "parked", "list", "-s", "ledger", "--bucket", "4")
		require.Equal(t, exitUsage, r.code, r.stderr)
		r = b.run(t, "parked", "list", "-s", "ledger", "--limit", "1", "--after", "acct-0")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "(more may follow: --after acct-1)")
	})
}
