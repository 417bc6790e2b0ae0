package console

import (
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

func TestTheChartsKeepAPointAStepForAnHour(t *testing.T) {
	t.Parallel()
	s := newSeries()
	t0 := time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)
	var ps []seriesPoint
	for i := range 2 * 3600 { // two hours of looks, one a second
		ps = s.add("orders", seriesPoint{At: t0.Add(time.Duration(i) * time.Second), Head: int64(i), Lag: int64(i % 7)})
	}
	require.Len(t, ps, 361, "a point per 10 s over the last hour, both ends kept")
	last := t0.Add(2*time.Hour - time.Second)
	require.Equal(t, last, ps[len(ps)-1].At, "the newest look")
	require.False(t, ps[0].At.Before(last.Add(-time.Hour)), "nothing older than an hour")
	for i := 1; i < len(ps); i++ {
		require.Equal(t, seriesStep, ps[i].At.Sub(ps[i-1].At), "one point a step")
	}

	before := s.add("orders", seriesPoint{At: last.Add(-time.Minute), Head: 1})
	require.Equal(t, ps, before, "an older look than the last is not recorded")

	for i := range maxCharted + 1 {
		s.add(fmt.Sprintf("s%d", i), seriesPoint{At: last.Add(time.Duration(i+1) * time.Second)})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.subs, maxCharted)
	_, kept := s.subs["orders"]
	require.False(t, kept, "the subscription looked at longest ago goes first")
}

// The page draws the last hour's lag and append rate from the points the
// console's looks took.
func TestTheChartsInARealBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "charted", "a", 2)
	c, srv := f.serve(t, Options{Categories: map[string]string{"charted": "acct"}})
	now := time.Now()
	for i := range 30 { // half an hour of points before the page opens
		c.series.add("charted", seriesPoint{At: now.Add(time.Duration(i-30) * time.Minute), Head: int64(600 * i), Lag: int64(i)})
	}
	b := newBrowser(t)
	b.run(t, chromedp.Navigate(srv.URL+"/s/charted"))
	b.waitFor(t, `document.querySelectorAll('#charts svg polyline').length === 2`, "both charts are drawn")
	caps := eval[string](t, b, `[...document.querySelectorAll('#charts figcaption')].map(c => c.textContent).join('|')`)
	require.Contains(t, caps, "lag, events behind (all buckets): ")
	require.Contains(t, caps, "appended to the store, events/s: ")
	require.Contains(t, eval[string](t, b, `document.querySelector('#charts .axis').textContent`), "max 29",
		"the lag's top is the seeded one: the look's own point has lag 0")
	require.Empty(t, b.takeErrors())
}
