package console

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// The timeline is the ownership record: it holds the changes made before
// any page looked, each at the time it was made — not the time a page
// happened to look — with the steps of a handoff apart, and who made each.
func TestTheTimelineIsTheOwnershipRecordWithTheTimesOfTheChanges(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	a := f.lease(t, "tl", "a", 4)
	b := f.join(t, "tl", "b", 4)
	settle(t, a, b)
	_, err := b.Pass(context.Background())
	require.NoError(t, err)

	_, srv := f.serve(t, Options{})
	st := decode[subState](t, get(t, srv, "/api/s/tl").body)
	var story []string
	for i := len(st.Timeline) - 1; i >= 0; i-- { // oldest first
		c := st.Timeline[i]
		require.True(t, c.At.Before(st.Now), "%s at %v, looked at %v", c.Kind, c.At, st.Now)
		if i < len(st.Timeline)-1 {
			require.False(t, c.At.Before(st.Timeline[i+1].At), "newest first")
		}
		require.NotEmpty(t, c.By, "who made it")
		if c.Bucket >= 0 {
			require.Equal(t, 0, c.Generation)
			story = append(story, fmt.Sprintf("%s %d %s->%s", c.Kind, c.Bucket, c.From, c.To))
		} else {
			require.Equal(t, -1, c.Generation)
			story = append(story, fmt.Sprintf("%s %s%s", c.Kind, c.From, c.To))
		}
	}
	// a joins and claims all four; b joins and asks for two; a releases
	// each to b, and b takes each: a handoff is two steps, both kept.
	require.Equal(t, []string{"join a", "claim 0 ->a", "claim 1 ->a", "claim 2 ->a", "claim 3 ->a", "join b"}, story[:6])
	kinds := map[string]int{}
	for _, c := range st.Timeline {
		kinds[c.Kind]++
	}
	require.Equal(t, map[string]int{"join": 2, "claim": 4, "request": 2, "release": 2, "handoff": 2}, kinds, "%v", story)
	for _, c := range st.Timeline {
		switch c.Kind {
		case "release":
			require.Equal(t, "handing over to b", c.Evidence)
		case "handoff":
			require.Equal(t, "a", c.From)
			require.Equal(t, "b", c.To)
			require.Contains(t, c.Evidence, "b had claimed it at ")
		}
	}
	require.True(t, st.WatchingSince.Before(st.Timeline[len(st.Timeline)-1].At), "the record keeps them all")
}

// A failover that handed positions out again shows on the subscription's
// page for a week (the record's function stands in for the processes that
// find one: eventsource's TestFailover promotes a real standby).
func TestThePageShowsAFailoverThatReusedPositions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "fo", "a", 2)
	_, srv := f.serve(t, Options{})
	st := decode[subState](t, get(t, srv, "/api/s/fo").body)
	require.Empty(t, st.Failovers)

	ctx := context.Background()
	note := `SELECT ` + f.store.QuotedSchema() + `.note_server_change($1, '7', 1, '7', 2, $2, $3)`
	_, err := f.store.Pool().Exec(ctx, note, "timeline", int64(70), int64(70)) // nothing reused
	require.NoError(t, err)
	_, err = f.store.Pool().Exec(ctx, note, "system", int64(90), int64(10))
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool { // a look is shared for a second
		st = decode[subState](t, get(t, srv, "/api/s/fo").body)
		return len(st.Failovers) > 0
	}, "the next look shows the failover")
	require.Len(t, st.Failovers, 1, "only the one that handed positions out again")
	require.Equal(t, failoverView{At: st.Failovers[0].At, Reason: "system", Old: "7/1", New: "7/2", HeadBefore: 90, HeadAfter: 10,
		FoundBy: st.Failovers[0].FoundBy}, st.Failovers[0])
}
