package console

import (
	"context"
	"net/http"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// park parks e's stream for sub as the holder of its bucket of n does,
// fenced by its lease.
func (f *fixture) park(t *testing.T, sub string, e eventsource.RecordedEvent, n int, reason string) {
	t.Helper()
	ls := f.lease(t, sub, "worker-"+e.Stream, n)
	res, err := ls.Renew(context.Background())
	require.NoError(t, err)
	b := e.Bucket(n)
	for _, l := range res.Owned {
		if l.Bucket == b {
			_, err := f.store.ParkStream(context.Background(), eventsource.DeadLetter{Subscription: sub, Bucket: b,
				EventID: e.ID, Reason: reason, Attempts: 5}, ls.Fence(b, l.Epoch))
			require.NoError(t, err)
			return
		}
	}
	t.Fatalf("no worker holds bucket %d", b)
}

func TestParkedStreamsAreShownAndActedOnWithTheCLIsRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	// f.events are acct-0 … acct-3 round robin: f.events[i] is acct-(i%4).
	f.park(t, "orders", f.events[4], 1, "handler: "+hostile) // acct-0 at version 1
	_, err := f.store.ParkStream(ctx, eventsource.DeadLetter{Subscription: "orders", EventID: f.events[1].ID, Reason: "x"}, nil)
	require.NoError(t, err)

	ro, roSrv := f.serve(t, Options{})
	st := decode[subState](t, get(t, roSrv, "/api/s/orders").body)
	require.Len(t, st.Parked, 2)
	p := st.Parked[0]
	require.Equal(t, "acct-0", p.Stream)
	require.NotNil(t, p.Bucket)
	require.Equal(t, 0, *p.Bucket)
	require.EqualValues(t, 3, p.Waiting, "acct-0 has 5 events; the letter is its second")
	require.Equal(t, "handler: "+hostile, p.Reason, "JSON carries it; the page sets it as text")
	require.Empty(t, p.Action)
	require.Equal(t, f.events[4].ID.String(), p.EventID)
	page := get(t, roSrv, "/s/orders").body
	require.Contains(t, page, `id="parked-streams"`)
	require.NotContains(t, page, hostile)
	r := post(t, roSrv, ro, "/api/s/orders/parked/replay?stream=acct-0")
	require.Equal(t, http.StatusForbidden, r.status, "read-only: %s", r.body)

	c, srv := f.serve(t, Options{AllowActions: true})
	base := "/api/s/orders/parked/"
	for _, tc := range []struct {
		path   string
		status int
	}{
		{"skip?stream=acct-0", http.StatusBadRequest},
		{"skip?stream=acct-0&confirm=acct-1", http.StatusBadRequest},
		{"rewind?stream=acct-0", http.StatusBadRequest},
		{"replay?stream=" + url.QueryEscape("no dash"), http.StatusBadRequest},
		{"replay?stream=acct-9", http.StatusNotFound},
	} {
		r := post(t, srv, c, base+tc.path)
		require.Equal(t, tc.status, r.status, "%s: %s", tc.path, r.body)
	}
	r = post(t, srv, c, "/api/s/nobody/parked/replay?stream=acct-0")
	require.Equal(t, http.StatusNotFound, r.status, r.body)
	cur, err := f.store.ParkedStreams(ctx, "orders", eventsource.ParkedFilter{})
	require.NoError(t, err)
	for _, p := range cur {
		require.Empty(t, p.Action, "no refused request changed anything")
	}

	r = post(t, srv, c, base+"replay?stream=acct-0")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "asked to replay stream acct-0")
	r = post(t, srv, c, base+"discard?stream=acct-0")
	require.Equal(t, http.StatusConflict, r.status, "being released: %s", r.body)
	r = post(t, srv, c, base+"skip?stream=acct-1&confirm=acct-1")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Contains(t, r.body, "skipped for good")

	st = decode[subState](t, get(t, srv, "/api/s/orders").body)
	require.Equal(t, "replay", st.Parked[0].Action)
	require.NotNil(t, st.Parked[0].RequestedAgo)
	require.EqualValues(t, 4, st.Parked[0].Waiting, "a replay makes the letter's event wait too")
	require.Equal(t, "skip", st.Parked[1].Action)
}
