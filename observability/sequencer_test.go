package observability_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

func TestRegisterSequencer(t *testing.T) {
	h := newHarness(t)
	status := observability.SequencerStatus{BacklogSeconds: 12.5, Failing: 7, Stuck: true, Batch: 625, Timeouts: 3, Resets: 1, Takeovers: 2}
	unregister := h.tel.RegisterSequencer(func() observability.SequencerStatus { return status })

	ms := h.collect(t)
	for name, want := range map[string]int64{
		obsname.MetricSequencerFailing:   7,
		obsname.MetricSequencerStuck:     1,
		obsname.MetricSequencerBatch:     625,
		obsname.MetricSequencerTimeouts:  3,
		obsname.MetricSequencerResets:    1,
		obsname.MetricSequencerTakeovers: 2,
	} {
		assert.Equal(t, want, sum(t, ms, name, nil), name)
	}
	secs, ok := ms[obsname.MetricSequencerBacklogSeconds].Data.(metricdata.Gauge[float64])
	require.True(t, ok)
	require.Len(t, secs.DataPoints, 1)
	assert.InDelta(t, 12.5, secs.DataPoints[0].Value, 1e-9)

	status = observability.SequencerStatus{Batch: 5000, Timeouts: 3, Resets: 1}
	ms = h.collect(t)
	assert.Zero(t, sum(t, ms, obsname.MetricSequencerStuck, nil), "recovered")
	assert.Zero(t, sum(t, ms, obsname.MetricSequencerFailing, nil))

	unregister()
	ms = h.collect(t)
	_, has := ms[obsname.MetricSequencerBatch]
	assert.False(t, has, "unregistered: gone")

	var nilTel *observability.Telemetry
	nilTel.RegisterSequencer(func() observability.SequencerStatus { return status })()
}
