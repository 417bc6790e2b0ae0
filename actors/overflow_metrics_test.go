package actors

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/observability"
)

// kumi.queue.dropped counts every live batch a reader's queue dropped, once:
// the batches DropOldest evicts (no state change reports them), and under
// PauseAndResume those of each pause and those refused while paused — not
// the queue's running total again at every pause.
func TestQueueDroppedCountsEveryDroppedBatchOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy overflow.Policy
		// enough says the queue dropped batches the way the case is about.
		enough func(overflow.Stats) bool
		what   string
	}{
		{overflow.DropOldest, func(s overflow.Stats) bool { return s.Evicted >= 3 }, "evicted 3 batches"},
		{overflow.PauseAndResume, func(s overflow.Stats) bool { return s.Pauses >= 2 }, "paused twice"},
	} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			store, schema := newTestStore(t)
			reader := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
			t.Cleanup(func() { _ = mp.Shutdown(ctx) })
			tel := observability.New(observability.Options{MeterProvider: mp, Logger: testLoggerOrDiscard()})

			rec := newRecorder()
			handler, first, gate := firstHeldHandler(rec, "w")
			o := groupOpts("dropped", 1, nil, "w")
			o.Handler, o.QueueCapacity, o.BatchSize, o.Overflow = handler, 1, 2, tc.policy
			w := startTracedWorker(t, schema, "w", o, tel)
			var release sync.Once
			open := func() { release.Do(func() { close(gate) }) }
			t.Cleanup(open) // before the worker's stop
			pgtest.Eventually(t, waitLong, func() bool { return len(w.owned()) == 1 }, "owns the bucket")
			queue := func() overflow.Stats { return w.queueStats(0) }
			appendOne := func(i int) { w.appendPosted(t, store, fmt.Sprintf("acct-%d", i), "Live") }
			appendOne(0)
			<-first
			n := 1
			for ; n < 100 && !tc.enough(queue()); n++ {
				appendOne(n)
			}
			require.True(t, tc.enough(queue()), "the queue %s: the test exercised the policy (stats %+v)", tc.what, queue())
			open()
			pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == n }, "all %d handled (got %d)", n, observed(rec.distinct))
			require.Zero(t, rec.duplicates())

			var rm metricdata.ResourceMetrics
			counted := func() float64 {
				require.NoError(t, reader.Collect(ctx, &rm))
				return sums(rm, obsname.MetricQueueDropped, obsname.AttrPolicy)[tc.policy.String()]
			}
			pgtest.Eventually(t, waitLong, func() bool { return counted() == float64(queue().Dropped) },
				"kumi.queue.dropped{policy=%s} is %v, the queue dropped %d batches (stats %+v)",
				tc.policy, observed(counted), observed(func() uint64 { return queue().Dropped }), observed(queue))
		})
	}
}
