package console

import (
	"context"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// resizing is a subscription "orders" of 4 buckets held by two workers
// (plain lease stores, no readers), with a resize to 8 requested: the
// test moves it through its states by the calls a reader makes.
type resizing struct {
	f       *fixture
	workers []*leasestore.Store
}

func newResizing(t *testing.T, f *fixture) *resizing {
	t.Helper()
	ctx := context.Background()
	r := &resizing{f: f, workers: []*leasestore.Store{f.lease(t, "orders", "worker-a", 4), f.lease(t, "orders", "worker-b", 4)}}
	settle(t, r.workers...)
	require.NoError(t, f.store.EnsureConsumerGroupIndex(ctx, 8))
	_, err := leasestore.RequestResize(ctx, f.store.Pool(), f.schema, leasestore.ResizeRequest{
		Subscription: "orders", Buckets: 8, By: "kumi@ops-1"})
	require.NoError(t, err)
	r.pass(t)
	return r
}

// pass runs a pass of every worker (they claim the new buckets).
func (r *resizing) pass(t *testing.T) {
	t.Helper()
	for _, s := range r.workers {
		_, err := s.Pass(context.Background())
		require.NoError(t, err)
	}
}

// propose has every holder of an old bucket propose; the last decides the
// cut, which it returns.
func (r *resizing) propose(t *testing.T) int64 {
	t.Helper()
	var cut int64
	for _, s := range r.workers {
		for _, l := range s.Held() {
			if l.Generation == 0 {
				b, err := s.ProposeCut(context.Background(), l.Slot, l.Epoch, 0)
				require.NoError(t, err)
				cut = b.Limit
			}
		}
	}
	return cut
}

// drain drains the old buckets for which keep returns true.
func (r *resizing) drain(t *testing.T, cut int64, keep func(bucket int) bool) {
	t.Helper()
	for _, s := range r.workers {
		for _, l := range s.Held() {
			if l.Generation == 0 && keep(l.Bucket) {
				require.NoError(t, s.Drain(context.Background(), l.Slot, l.Epoch, cut))
			}
		}
	}
}

func TestTheSubscriptionShowsAResizeInProgress(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := newResizing(t, f)
	c, srv := f.serve(t, Options{Categories: map[string]string{"orders": "acct"}})
	// Each look a second after the last: viewers share one read a second.
	var clock time.Time
	c.looks.now = func() time.Time { return clock }
	look := func() subState {
		clock = clock.Add(lookEvery)
		return decode[subState](t, get(t, srv, "/api/s/orders").body)
	}

	st := look()
	require.NotNil(t, st.Resize)
	require.Equal(t, "sealing", st.Resize.State)
	require.Equal(t, 0, st.Generation)
	require.Equal(t, []int{0, 1, 4, 8}, []int{st.Resize.Generation, st.Resize.NextGeneration, st.Resize.From, st.Resize.To})
	require.Nil(t, st.Resize.Cut, "no cut before the proposals")
	require.Equal(t, "kumi@ops-1", st.Resize.RequestedBy)
	require.Len(t, st.Resize.Old, 4)
	require.Len(t, st.Resize.New, 8)
	require.Len(t, st.Rows, 4, "the bucket map is the serving generation's")
	require.Equal(t, 4, st.Buckets)
	for _, b := range st.Resize.New {
		require.False(t, b.Ready, "new bucket %d stands by", b.Bucket)
		require.Equal(t, 65536+b.Bucket, b.Slot)
	}
	require.Contains(t, get(t, srv, "/s/orders").body, `id="resize"`)

	cut := r.propose(t)
	st = look()
	require.Equal(t, "cut", st.Resize.State)
	require.NotNil(t, st.Resize.Cut)
	require.Equal(t, cut, *st.Resize.Cut)
	for _, b := range st.Resize.Old {
		require.NotNil(t, b.Proposal, "old bucket %d proposed", b.Bucket)
		require.LessOrEqual(t, *b.Proposal, cut)
	}

	// Old bucket 0 feeds new buckets 0 and 4 (gcd(4, 8) = 4): its drain is
	// the switch.
	r.drain(t, cut, func(b int) bool { return b == 0 })
	st = look()
	require.Equal(t, "switched", st.Resize.State)
	require.Equal(t, 1, st.Resize.Drained)
	require.Equal(t, 2, st.Resize.Ready)
	require.True(t, st.Resize.Old[0].Drained)
	require.Empty(t, st.Resize.Old[0].Owner, "a drained bucket has no owner")
	require.True(t, st.Resize.New[0].Ready)
	require.True(t, st.Resize.New[4].Ready)
	require.False(t, st.Resize.New[1].Ready)

	r.drain(t, cut, func(b int) bool { return b != 0 })
	r.pass(t)
	st = look()
	require.Nil(t, st.Resize, "the resize completed")
	require.Equal(t, 1, st.Generation)
	require.Equal(t, 8, st.Buckets)
	require.Len(t, st.Rows, 8)
	var steps []string
	for _, ch := range st.Timeline {
		if ch.Kind == "resize" {
			steps = append([]string{ch.To}, steps...) // newest first
		}
	}
	require.Equal(t, []string{"resize 1: 4 -> 8 buckets, sealing", "resize 1: 4 -> 8 buckets, cut, cut " + itoa(cut),
		"resize 1: 4 -> 8 buckets, switched, cut " + itoa(cut), "generation 1, 8 buckets"}, steps,
		"the timeline holds every step, whether or not a page looked")
}

func TestTheResizeInARealBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := newResizing(t, f)
	cut := r.propose(t)
	r.drain(t, cut, func(b int) bool { return b == 1 })
	_, srv := f.serve(t, Options{Categories: map[string]string{"orders": "acct"}})
	b := newBrowser(t)
	b.run(t, chromedp.Navigate(srv.URL+"/s/orders"))
	b.waitFor(t, `!document.querySelector('#resize').hidden`, "the resize section shows")
	require.Equal(t, 4, eval[int](t, b, `document.querySelectorAll('#map .cell').length`), "the serving generation's map")
	require.Equal(t, 4, eval[int](t, b, `document.querySelectorAll('#resize-old .cell').length`))
	require.Equal(t, 8, eval[int](t, b, `document.querySelectorAll('#resize-new .cell').length`))
	require.Equal(t, "1", eval[string](t, b, `[...document.querySelectorAll('#resize-old .cell.drained')].map(c => c.querySelector('.b').textContent.slice(1)).join(',')`))
	require.Equal(t, 6, eval[int](t, b, `document.querySelectorAll('#resize-new .cell.standby').length`),
		"new buckets 1 and 5 are ready, the others stand by")
	state := eval[string](t, b, `document.querySelector('#resize-state').textContent`)
	require.Contains(t, state, "4 → 8 buckets, state switched, cut at position "+itoa(cut))
	require.Contains(t, state, "by kumi@ops-1")
	require.Empty(t, b.takeErrors(), "no console errors, exceptions or dialogs")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// After a resize the actions name the serving generation's bucket, as the
// map shows it: a reset writes its slot's checkpoint, a relinquish places
// the claim on its slot (both used to reach generation 0's slot, drained
// and retired).
func TestActionsAfterAResizeNameTheServingGeneration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	r := newResizing(t, f)
	cut := r.propose(t)
	r.drain(t, cut, func(int) bool { return true })
	r.pass(t)
	c, srv := f.serve(t, Options{AllowActions: true})

	res := post(t, srv, c, "/api/s/orders/buckets/5/reset?position=3&force=1")
	require.Equal(t, http.StatusOK, res.status, res.body)
	require.Contains(t, decode[map[string]string](t, res.body)["message"], "bucket 5: checkpoint "+strconv.FormatInt(cut, 10)+" -> 3")
	p, err := f.store.Checkpoint(ctx, "orders", eventsource.Slot(1, 5))
	require.NoError(t, err)
	require.EqualValues(t, 3, p)

	f.join(t, "orders", "worker-c", 4) // live, least loaded, no claim yet
	res = post(t, srv, c, "/api/s/orders/buckets/6/relinquish?to=worker-c")
	require.Equal(t, http.StatusOK, res.status, res.body)
	require.Contains(t, decode[map[string]string](t, res.body)["message"], "hand bucket 6")
	snap, err := leasestore.ReadSnapshot(ctx, f.store.Pool(), f.schema, "orders")
	require.NoError(t, err)
	for _, s := range snap.Buckets {
		if s.Slot == eventsource.Slot(1, 6) {
			require.Equal(t, "worker-c", s.ClaimWorker)
		} else {
			require.Empty(t, s.ClaimWorker, "slot %d", s.Slot)
		}
	}
}
