package actors

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

// A burst of large events reaches a reader whose handler is stuck: its
// queue applies the policy on its byte bound long before its batch
// capacity, its catch-up pages stay within the byte bound too, the
// runtime's shared budget counts what the queue holds and gets it all back
// when the group stops — and every event is handled once, in order, under
// every policy. Then one append larger than the publisher's fetch bound is
// fetched in more than one read.
func TestLargeEventsStayWithinTheReadersByteBound(t *testing.T) {
	t.Parallel()
	for _, policy := range []overflow.Policy{overflow.PauseAndResume, overflow.DropSubscription, overflow.DropOldest} {
		t.Run(policy.String(), func(t *testing.T) {
			t.Parallel()
			testLargeEvents(t, policy)
		})
	}
}

func testLargeEvents(t *testing.T, policy overflow.Policy) {
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	handler, first, gate := firstHeldHandler(rec, "w")
	const (
		maxBytes = 256 << 10
		perEvent = 16 << 10
		appends  = 20
		perAdd   = 10
		n        = 1 + appends*perAdd
	)
	tel, spans := spanRecorder(t)
	w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 12)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond, Telemetry: tel})
	require.NoError(t, err)
	o := groupOpts("bytes", 1, nil, "w")
	// The batch capacity is never reached: only the byte bound can apply
	// the policy.
	o.Handler, o.QueueCapacity, o.QueueBytes, o.Overflow = handler, 10_000, maxBytes, policy
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			w.stop(t)
		}
	})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open) // runs first: a failed test still stops
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 1 }, "owns the bucket")
	queue := func() (overflow.Stats, error) {
		w.group.g.mu.Lock()
		defer w.group.g.mu.Unlock()
		if q := w.group.g.queues[0]; q != nil {
			return q.Stats(), q.Err()
		}
		return overflow.Stats{}, nil
	}
	big := func(k, size int) []eventsource.EventData {
		payload := fmt.Sprintf(`{"p":%q}`, strings.Repeat("x", size))
		out := make([]eventsource.EventData, k)
		for i := range out {
			out[i] = eventsource.EventData{Type: "Big", Data: []byte(payload)}
		}
		return out
	}
	_, err = store.Append(ctx, "acct-0", eventsource.Any, big(1, perEvent))
	require.NoError(t, err)
	<-first

	var peak int64
	for i := 1; i <= appends; i++ {
		before, _ := queue()
		_, err := store.Append(ctx, fmt.Sprintf("acct-%d", i%7), eventsource.Any, big(perAdd, perEvent))
		require.NoError(t, err)
		pgtest.Eventually(t, waitLong, func() bool { st, _ := queue(); return st.Posted > before.Posted }, "append %d posted", i)
		st, _ := queue()
		peak = max(peak, st.Bytes)
		require.Equal(t, st.Bytes, w.rt.budget.Used(), "the runtime's budget counts what the one queue holds")
	}
	st, qerr := queue()
	require.Less(t, st.Depth, o.QueueCapacity)
	switch policy {
	case overflow.PauseAndResume:
		require.Positive(t, st.Pauses, "the byte bound paused the queue")
	case overflow.DropOldest:
		require.Positive(t, st.Evicted, "the byte bound evicted batches")
	case overflow.DropSubscription:
		var oe *OverflowError
		require.ErrorAs(t, qerr, &oe, "the byte bound overflowed the queue")
		require.Equal(t, overflow.BoundBytes, oe.Bound)
		require.Equal(t, int64(maxBytes), oe.Limit)
	}
	// A batch here is one append: 10 events.
	require.LessOrEqual(t, peak, int64(maxBytes+perAdd*(perEvent+1024)), "the queue held more than its byte bound and one batch")

	open()
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == n }, "all %d handled (got %d)", n, observed(rec.distinct))

	// One append larger than a publisher fetch (4 MiB): fetched in parts.
	const huge, hugeEvent = 80, 64 << 10
	_, err = store.Append(ctx, "acct-huge", eventsource.Any, big(huge, hugeEvent))
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == n+huge }, "the large append handled (got %d)", observed(rec.distinct))
	require.Zero(t, rec.duplicates())
	require.Empty(t, rec.order)

	// Catch-up pages: at most the byte bound and the event that reaches
	// it; publisher fetches: at most 4 MiB and the event that reaches it.
	for _, p := range spansNamed(spans, obsname.SpanReaderFetch) {
		count := attr(p, obsname.AttrCount).AsInt64()
		require.LessOrEqual(t, count, int64(maxBytes/perEvent+1), "a catch-up page of %d events of at least %d bytes", count, perEvent)
	}
	fetches := spansNamed(spans, obsname.SpanPublisherFetch)
	require.NotEmpty(t, fetches)
	for _, p := range fetches {
		count := attr(p, obsname.AttrCount).AsInt64()
		require.LessOrEqual(t, count, int64(publisherFetchBytes/hugeEvent+1), "a publisher fetch of %d events", count)
	}

	w.stop(t)
	stopped = true
	require.Zero(t, w.rt.budget.Used(), "a stopped reader's queue gives its bytes back")
}

func TestQueueBytesOptionsAreValidated(t *testing.T) {
	t.Parallel()
	base := GroupOptions{Subscription: "s", Category: "c", Buckets: 4, Handler: ackHandler(newRecorder(), "w")}
	for _, v := range []int64{-1, MinQueueBytes - 1, MaxQueueBytes + 1} {
		o := base
		o.QueueBytes = v
		var oe *kumierr.ConfigError
		require.ErrorAs(t, o.WithDefaults().Validate(), &oe, "QueueBytes %d", v)
		require.Equal(t, "actors.GroupOptions.QueueBytes", oe.Field)
		require.Contains(t, oe.Error(), "must be in [65536, 1099511627776]")
	}
	o := base.WithDefaults()
	require.Equal(t, int64(QueueBytesDefault), o.QueueBytes)
	require.NoError(t, o.Validate())

	store, _ := newTestStore(t)
	for _, v := range []int64{-1, MinRuntimeQueueBytes - 1, MaxQueueBytes + 1} {
		_, err := startedRuntime(context.Background(), quietSystem(), store, RuntimeOptions{QueueBytes: v})
		var oe *kumierr.ConfigError
		require.True(t, errors.As(err, &oe), "RuntimeOptions.QueueBytes %d: %v", v, err)
		require.Equal(t, "actors.RuntimeOptions.QueueBytes", oe.Field)
	}
}

// The readers of a worker share the process's budget for their read-ahead
// too: with 8 readers and a 16 MiB budget each reads ahead at most 2 MiB
// (and the event that reaches it), though its own QueueBytes is 8 MiB —
// and loses nothing.
func TestReadersShareTheProcessBudgetForTheirReadAhead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	rec := newRecorder()
	gate := make(chan struct{})
	handler := actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			<-gate // every bucket stuck while the backlog arrives
			rec.begin("w", d.Event)
			rec.end("w", d.Event)
			ctx.Respond(Ack{})
		}
	})
	const (
		buckets   = 8
		budget    = MinRuntimeQueueBytes // 16 MiB: 2 MiB a reader
		perEvent  = 64 << 10
		n         = 960
		perAppend = 8
	)
	tel, spans := spanRecorder(t)
	w := &testWorker{name: "w", sys: quietSystem(), pool: pgtest.NewPool(t, 12)}
	s, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, s, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond,
		Telemetry: tel, QueueBytes: budget})
	require.NoError(t, err)
	o := groupOpts("share", buckets, nil, "w")
	// Leases that outlast a loaded machine's stalls: a reader that drains
	// and is replaced meanwhile would leave a larger share to the others.
	o.Handler, o.Lease = handler, leasestore.LeaseOptions{TTL: 20 * time.Second, Heartbeat: 500 * time.Millisecond, Margin: 5 * time.Second}
	// The handlers wait at the gate while the burst is appended, which took
	// over the default 30 s once on a loaded machine: each was then taken
	// for hung and replaced, and its delivery, handled by both handlers
	// once the gate opened, counted as a duplicate.
	o.HandlerTimeout = 10 * time.Minute
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	t.Cleanup(open) // runs first: a failed test still stops
	pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == buckets && w.rt.readers.Load() == buckets },
		"a reader for each bucket")

	payload := []byte(fmt.Sprintf(`{"p":%q}`, strings.Repeat("x", perEvent)))
	for i := 0; i < n; i += perAppend {
		batch := make([]eventsource.EventData, perAppend)
		for j := range batch {
			batch[j] = eventsource.EventData{Type: "Big", Data: payload}
		}
		_, err := store.Append(ctx, fmt.Sprintf("acct-%d", i/perAppend), eventsource.Any, batch)
		require.NoError(t, err)
	}
	head, err := store.HeadPosition(ctx)
	require.NoError(t, err)
	pgtest.Eventually(t, waitLong, func() bool {
		pos, err := w.sys.Root.RequestFuture(w.rt.publisher, &publisherPosition{}, time.Second).Result()
		return err == nil && pos.(int64) >= head
	}, "the publisher has posted the backlog")
	require.LessOrEqual(t, w.rt.budget.Used(), int64(budget), "the queues together within the budget")
	open()
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == n }, "all %d handled (got %d)", n, observed(rec.distinct))
	require.Zero(t, rec.duplicates())
	require.Empty(t, rec.order)

	share := int64(budget / buckets)
	var pages int
	for _, p := range spansNamed(spans, obsname.SpanReaderFetch) {
		count := attr(p, obsname.AttrCount).AsInt64()
		require.LessOrEqual(t, count, share/perEvent+1, "a catch-up page of %d events of %d bytes: more than the reader's share", count, perEvent)
		if count > 0 {
			pages++
		}
	}
	require.Positive(t, pages, "the readers caught up from the store: each read ahead only its share, and the rest of the backlog paused their queues and was re-read")
}
