package console

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

func TestTimelineNamesEachKindOfChangeWithItsEvidence(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	row := func(b int, owner string, epoch int64, expires time.Time, claim string) inspect.BucketRow {
		r := inspect.BucketRow{BucketState: leasestore.BucketState{Bucket: b, BucketCount: 6, Owner: owner, Epoch: epoch,
			Expires: expires, Heartbeat: expires.Add(-10 * time.Second), ClaimWorker: claim, ClaimedAt: t0}}
		r.Live = owner != "" && expires.After(t0)
		return r
	}
	worker := func(w string, live bool) leasestore.WorkerState { return leasestore.WorkerState{Worker: w, Live: live} }
	later := t0.Add(time.Minute)
	prev := inspect.Inspection{Subscription: "s", Now: t0,
		Workers: []leasestore.WorkerState{worker("a", true), worker("b", true), worker("gone", true), worker("s", true)},
		Rows: []inspect.BucketRow{
			row(0, "", 0, time.Time{}, ""),              // claimed by c
			row(1, "a", 3, t0.Add(time.Second), "b"),    // handed over to b
			row(2, "gone", 4, t0.Add(-time.Second), ""), // stolen by b: expired
			row(3, "a", 5, t0.Add(time.Second), ""),     // released
			row(4, "a", 6, t0.Add(time.Second), ""),     // b places a claim; the lease expires
			row(5, "b", 7, t0.Add(30*time.Second), ""),  // unchanged
			row(6, "a", 8, t0.Add(time.Hour), ""),       // handed over between two looks
			row(7, "s", 9, t0.Add(time.Hour), ""),       // stolen: s's session is gone
			row(8, "a", 11, t0.Add(time.Second), ""),    // expiry passed, but a renewed and handed over
		}}
	cur := inspect.Inspection{Subscription: "s", Now: later,
		Workers: []leasestore.WorkerState{{Worker: "a", Live: true, Heartbeat: later}, worker("b", true), worker("c", true),
			{Worker: "s", Live: true, SessionGone: true}},
		Rows: []inspect.BucketRow{
			row(0, "c", 1, later.Add(time.Minute), ""),
			row(1, "b", 4, later.Add(time.Minute), ""),
			row(2, "b", 5, later.Add(time.Minute), ""),
			row(3, "", 5, time.Time{}, ""),
			row(4, "a", 6, t0.Add(time.Second), "b"),
			row(5, "b", 7, t0.Add(30*time.Second), ""),
			row(6, "b", 9, later.Add(time.Minute), ""),
			row(7, "b", 10, later.Add(time.Minute), ""),
			row(8, "b", 12, later.Add(time.Minute), ""),
		}}
	cur.Rows[4].Live = false
	got := map[string]Change{}
	for _, ch := range diff(prev, cur) {
		require.Equal(t, later, ch.At)
		key := ch.Kind
		if ch.Bucket >= 0 {
			key += string(rune('0' + ch.Bucket))
		}
		got[key] = ch
	}
	require.Len(t, got, 11, "%v", got)
	require.Equal(t, Change{At: later, Kind: kindJoin, Bucket: -1, To: "c"}, got["join"])
	require.Equal(t, Change{At: later, Kind: kindLeave, Bucket: -1, From: "gone"}, got["leave"])
	require.Equal(t, "c", got["claim0"].To)
	require.Equal(t, "a", got["handoff1"].From)
	require.Equal(t, "b", got["handoff1"].To)
	require.Contains(t, got["handoff1"].Evidence, "b had claimed it")
	steal := got["steal2"]
	require.Equal(t, "gone", steal.From)
	require.Equal(t, int64(5), steal.Epoch)
	require.Contains(t, steal.Evidence, "gone's lease had expired at 03:04:04.000")
	require.Contains(t, steal.Evidence, "gone has left the pool")
	require.Equal(t, "a", got["release3"].From)
	require.Equal(t, "b", got["request4"].To)
	require.Contains(t, got["expire4"].Evidence, "lease expired at 03:04:06.000")
	require.Contains(t, got["handoff6"].Evidence, "between two looks", "a live lease moves only by handoff: %v", got)
	require.Equal(t, "s", got["steal7"].From)
	require.Contains(t, got["steal7"].Evidence, "s has lost its session")
	require.Contains(t, got["handoff8"].Evidence, "a was still renewing", "an owner that renewed past the expiry seen handed over: %v", got)

	h := newHistory()
	first, since := h.observe(prev)
	require.Empty(t, first)
	require.Equal(t, t0, since)
	all, _ := h.observe(cur)
	require.Len(t, all, 11)
	again, _ := h.observe(prev)
	require.Len(t, again, 11, "an older look than the last is not diffed")
}
