package observability

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/kumi-run/kumi/internal/obsname"
)

// SequencerStatus is a snapshot of a process's event-store sequencer
// (eventsource.Sequencer.Stats), for the kumi.sequencer.* metrics.
type SequencerStatus struct {
	// BacklogSeconds is the age of the oldest committed event without a
	// position (0 when there is none).
	BacklogSeconds float64
	// Failing is the number of failed tries in a row (0 when healthy);
	// Stuck whether the sequencer reports itself stuck.
	Failing int64
	Stuck   bool
	// Batch is the current step size; Timeouts and Resets count steps cut
	// by a timeout and resets of the events' sequence, since the start;
	// Takeovers the stalled holders of the sequencer row this process ended.
	Batch     int64
	Timeouts  int64
	Resets    int64
	Takeovers int64
	// Stranded counts committed appends found below the sequencer's
	// watermark without a position, and numbered (after a failover, see
	// docs/design/eventsource.md); ServerChanges the changes of server the store
	// found (another system or timeline, or a head below a position seen).
	Stranded      int64
	ServerChanges int64
}

// RegisterSequencer reports f's snapshots as the kumi.sequencer.* metrics
// and returns a function that stops it (call it when the sequencer stops).
// f is called on every metrics collection: it must be quick.
func (t *Telemetry) RegisterSequencer(f func() SequencerStatus) (unregister func()) {
	if t == nil || f == nil {
		return func() {}
	}
	m := t.meter
	var errs []error
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := m.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	backlog, err := m.Float64ObservableGauge(obsname.MetricSequencerBacklogSeconds, metric.WithUnit(obsname.UnitSeconds),
		metric.WithDescription("Age of the oldest committed event without a position (0 when none)."))
	errs = append(errs, err)
	failing := gauge(obsname.MetricSequencerFailing, obsname.UnitFailure, "Failed sequencer tries in a row (0 when healthy).")
	stuck := gauge(obsname.MetricSequencerStuck, obsname.UnitSequencer, "1 while the sequencer reports itself stuck, else 0.")
	batch := gauge(obsname.MetricSequencerBatch, obsname.UnitEvent, "The sequencer's current step size (halved after timeouts).")
	timeouts := counter(obsname.MetricSequencerTimeouts, obsname.UnitStep, "Sequencer steps cancelled by a timeout and retried smaller.")
	resets := counter(obsname.MetricSequencerResets, obsname.UnitReset, "Resets of the events' seq sequence found and recovered from.")
	takeovers := counter(obsname.MetricSequencerTakeovers, obsname.UnitTakeover, "Stalled holders of the sequencer row this process ended (pg_terminate_backend).")
	stranded := counter(obsname.MetricSequencerStranded, obsname.UnitEvent, "Committed appends found below the watermark without a position, and numbered.")
	changes := counter(obsname.MetricStoreServerChanges, obsname.UnitChange, "Changes of server the event store found: another system or timeline, or a head below a position seen.")
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := f()
		o.ObserveFloat64(backlog, s.BacklogSeconds)
		o.ObserveInt64(failing, s.Failing)
		st := int64(0)
		if s.Stuck {
			st = 1
		}
		o.ObserveInt64(stuck, st)
		o.ObserveInt64(batch, s.Batch)
		o.ObserveInt64(timeouts, s.Timeouts)
		o.ObserveInt64(resets, s.Resets)
		o.ObserveInt64(takeovers, s.Takeovers)
		o.ObserveInt64(stranded, s.Stranded)
		o.ObserveInt64(changes, s.ServerChanges)
		return nil
	}, backlog, failing, stuck, batch, timeouts, resets, takeovers, stranded, changes)
	if err = errors.Join(append(errs, err)...); err != nil {
		otel.Handle(err)
	}
	if reg == nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}
