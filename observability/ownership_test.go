package observability_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

// TestOwnershipChangeSpans records one change of every kind inside a
// reconcile pass and checks each span's name, parent, attributes and the
// counter.
func TestOwnershipChangeSpans(t *testing.T) {
	h := newHarness(t)
	ctx, pass := h.tel.StartReconcile(context.Background(), "orders", "w1")
	for i, kind := range observability.ChangeKinds {
		c := observability.OwnershipChange{
			Kind: kind, Subscription: "orders", Bucket: i, Worker: "w1", Epoch: int64(100 + i),
			Peer: "w2", Reason: "reason " + string(kind),
		}
		if kind == observability.ChangeSteal {
			c.Evidence = "lease_expired"
		}
		h.tel.OwnershipChange(ctx, c)
	}
	pass.End(observability.PassSummary{LiveWorkers: 2, FairShare: 5, Owned: 5, Claimed: 1, Taken: 1, Stolen: 1, Given: 1, Shed: 1, Released: 1, Lost: 2})

	rec := h.ended(obsname.SpanReconcile)
	require.Len(t, rec, 1)
	ra := attrs(rec[0])
	assert.Equal(t, "orders", ra[obsname.AttrSubscription])
	assert.Equal(t, "w1", ra[obsname.AttrWorker])
	assert.EqualValues(t, 2, ra[obsname.AttrLiveWorkers])
	assert.EqualValues(t, 5, ra[obsname.AttrFairShare])
	assert.EqualValues(t, 2, ra[obsname.AttrLost])

	wantNames := map[observability.ChangeKind]string{
		observability.ChangeClaim:          obsname.SpanLeaseClaim,
		observability.ChangeRenewFailed:    obsname.SpanLeaseRenewFailed,
		observability.ChangeShed:           obsname.SpanLeaseShed,
		observability.ChangeHandoffRequest: obsname.SpanLeaseHandoffRequest,
		observability.ChangeHandoffGive:    obsname.SpanLeaseHandoffGive,
		observability.ChangeHandoffTake:    obsname.SpanLeaseHandoffTake,
		observability.ChangeSteal:          obsname.SpanLeaseSteal,
		observability.ChangeRelease:        obsname.SpanLeaseRelease,
		observability.ChangeFenceLost:      obsname.SpanLeaseFenceLost,
	}
	require.Len(t, wantNames, len(observability.ChangeKinds))
	ms := h.collect(t)
	for i, kind := range observability.ChangeKinds {
		t.Run(string(kind), func(t *testing.T) {
			spans := h.ended(wantNames[kind])
			require.Len(t, spans, 1)
			s := spans[0]
			assert.Equal(t, kind.SpanName(), s.Name)
			assert.Equal(t, rec[0].SpanContext.TraceID(), s.SpanContext.TraceID())
			assert.Equal(t, rec[0].SpanContext.SpanID(), s.Parent.SpanID(), "child of the reconcile pass")
			assert.Equal(t, trace.SpanKindInternal, s.SpanKind)
			a := attrs(s)
			assert.Equal(t, string(kind), a[obsname.AttrChange])
			assert.Equal(t, "orders", a[obsname.AttrSubscription])
			assert.EqualValues(t, i, a[obsname.AttrBucket])
			assert.Equal(t, "w1", a[obsname.AttrWorker])
			assert.EqualValues(t, 100+i, a[obsname.AttrEpoch])
			assert.Equal(t, "w2", a[obsname.AttrPeer])
			assert.Equal(t, "reason "+string(kind), a[obsname.AttrReason])
			if kind == observability.ChangeSteal {
				assert.Equal(t, "lease_expired", a[obsname.AttrEvidence])
			} else {
				assert.NotContains(t, a, obsname.AttrEvidence)
			}
			assert.Equal(t, codes.Unset, s.Status.Code)
			assert.EqualValues(t, 1, sum(t, ms, obsname.MetricOwnershipChanges, map[string]any{
				obsname.AttrSubscription: "orders", obsname.AttrChange: string(kind)}))
		})
	}
	assert.EqualValues(t, len(observability.ChangeKinds), sum(t, ms, obsname.MetricOwnershipChanges, nil))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricRebalances, map[string]any{obsname.AttrSubscription: "orders"}))

	logs := h.logs.String()
	assert.Contains(t, logs, `level=WARN msg="kumi: ownership change" change=renew_failed`)
	assert.Contains(t, logs, `level=WARN msg="kumi: ownership change" change=fence_lost`)
	assert.Contains(t, logs, `level=INFO msg="kumi: ownership change" change=steal`)
	assert.Contains(t, logs, `level=DEBUG msg="kumi: ownership change" change=claim`)
}

func TestOwnershipChangeStartAndError(t *testing.T) {
	h := newHarness(t)
	start := time.Now().Add(-50 * time.Millisecond)
	h.tel.OwnershipChange(context.Background(), observability.OwnershipChange{
		Kind: observability.ChangeFenceLost, Subscription: "orders", Bucket: 2, Worker: "w1", Epoch: 3,
		Start: start, Err: errors.New("checkpoint fenced"),
	})
	s := h.ended(obsname.SpanLeaseFenceLost)
	require.Len(t, s, 1)
	assert.True(t, s[0].StartTime.Equal(start), "span starts at Start")
	assert.GreaterOrEqual(t, s[0].EndTime.Sub(s[0].StartTime), 50*time.Millisecond)
	assert.False(t, s[0].Parent.IsValid(), "no pass: a root span")
	assert.Equal(t, codes.Error, s[0].Status.Code)
	require.Len(t, s[0].Events, 1)
	assert.Equal(t, "exception", s[0].Events[0].Name)
	assert.Contains(t, h.logs.String(), `err="checkpoint fenced"`)
}

func TestReconcileMetrics(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	_, p := h.tel.StartReconcile(ctx, "orders", "w1")
	p.End(observability.PassSummary{LiveWorkers: 1, FairShare: 4, Owned: 4, Claimed: 4})
	_, p = h.tel.StartReconcile(ctx, "orders", "w1")
	p.End(observability.PassSummary{LiveWorkers: 2, FairShare: 2, Owned: 4, Shed: 2}) // shed alone is no rebalance
	_, p = h.tel.StartReconcile(ctx, "orders", "w1")
	p.End(observability.PassSummary{Err: errors.New("db down")})

	ms := h.collect(t)
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricRebalances, nil))
	assert.EqualValues(t, 2, histCount(t, ms, obsname.MetricReconcileDuration, map[string]any{obsname.AttrOutcome: "ok"}))
	assert.EqualValues(t, 1, histCount(t, ms, obsname.MetricReconcileDuration, map[string]any{obsname.AttrOutcome: "error"}))
	failed := h.ended(obsname.SpanReconcile)[2]
	assert.Equal(t, codes.Error, failed.Status.Code)
}

func TestLeaseOperation(t *testing.T) {
	h := newHarness(t)
	ctx, pass := h.tel.StartReconcile(context.Background(), "orders", "w1")
	start := time.Now()
	h.tel.LeaseOperation(ctx, "orders", observability.LeaseRenew, start, nil)
	h.tel.LeaseOperation(ctx, "orders", observability.LeaseRenew, start, nil)
	h.tel.LeaseOperation(ctx, "orders", observability.LeaseClaim, start, errors.New("serialization failure"))
	pass.End(observability.PassSummary{})

	ms := h.collect(t)
	renew := map[string]any{obsname.AttrOperation: "renew"}
	assert.EqualValues(t, 2, sum(t, ms, obsname.MetricLeaseOperations, map[string]any{obsname.AttrOperation: "renew", obsname.AttrOutcome: "ok"}))
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricLeaseOperations, map[string]any{obsname.AttrOperation: "claim", obsname.AttrOutcome: "error"}))
	assert.EqualValues(t, 2, histCount(t, ms, obsname.MetricLeaseDuration, renew))

	rec := h.ended(obsname.SpanReconcile)
	require.Len(t, rec, 1)
	require.Len(t, rec[0].Events, 1)
	assert.Equal(t, obsname.EventLeaseError, rec[0].Events[0].Name)
	assert.Contains(t, h.logs.String(), `level=WARN msg="kumi: lease operation failed"`)
}

func TestLeasePassLate(t *testing.T) {
	h := newHarness(t)
	h.tel.LeasePassLate(context.Background(), observability.LatePass{Subscription: "orders", Worker: "w1",
		Duration: 1200 * time.Millisecond, Gap: 2 * time.Second, Heartbeat: 500 * time.Millisecond, TTL: 3 * time.Second, Margin: time.Second})
	ms := h.collect(t)
	assert.EqualValues(t, 1, sum(t, ms, obsname.MetricLeasePassesLate, map[string]any{obsname.AttrSubscription: "orders"}))
	assert.Contains(t, h.logs.String(), `level=WARN msg="kumi: lease pass ran late`)
	assert.Contains(t, h.logs.String(), `gap=2s`)
}
