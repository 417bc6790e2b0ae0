package observability

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/kumi-run/kumi/internal/obsname"
)

// ReplicaStatus is a snapshot of a process's reads on a hot standby
// (eventsource.ReadReplica.Stats), for the kumi.replica.* metrics.
type ReplicaStatus struct {
	// LagEvents is the primary's head minus the standby's, LagSeconds how
	// long ago the primary had a head the standby does not show yet.
	LagEvents  int64
	LagSeconds float64
	// FallingBack reports whether reads go to the primary.
	FallingBack bool
	// StandbyReads and PrimaryReads count the pages read on the standby
	// and those read on the primary instead, since the start.
	StandbyReads, PrimaryReads int64
}

// RegisterReplica reports f's snapshots as the kumi.replica.* metrics and
// returns a function that stops it. f is called on every metrics
// collection: it must be quick.
func (t *Telemetry) RegisterReplica(f func() ReplicaStatus) (unregister func()) {
	if t == nil || f == nil {
		return func() {}
	}
	m := t.meter
	lagEvents, err1 := m.Int64ObservableGauge(obsname.MetricReplicaLagEvents, metric.WithUnit(obsname.UnitEvent),
		metric.WithDescription("Sequenced events the read replica does not show yet (the primary's head minus the standby's)."))
	lagSeconds, err2 := m.Float64ObservableGauge(obsname.MetricReplicaLagSeconds, metric.WithUnit(obsname.UnitSeconds),
		metric.WithDescription("How long ago the primary had a head the read replica does not show yet (0 when it shows the primary's head)."))
	fallingBack, err3 := m.Int64ObservableGauge(obsname.MetricReplicaFallingBack, metric.WithUnit(obsname.UnitReplica),
		metric.WithDescription("1 while reads go to the primary (lag past FallbackLag, or the standby unreachable), else 0."))
	reads, err4 := m.Int64ObservableCounter(obsname.MetricReplicaReads, metric.WithUnit(obsname.UnitRead),
		metric.WithDescription("Catch-up and publisher pages read, by where: standby, or primary (a fallback)."))
	standby := metric.WithAttributes(attribute.String(obsname.AttrReadOn, "standby"))
	primary := metric.WithAttributes(attribute.String(obsname.AttrReadOn, "primary"))
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := f()
		o.ObserveInt64(lagEvents, s.LagEvents)
		o.ObserveFloat64(lagSeconds, s.LagSeconds)
		fb := int64(0)
		if s.FallingBack {
			fb = 1
		}
		o.ObserveInt64(fallingBack, fb)
		o.ObserveInt64(reads, s.StandbyReads, standby)
		o.ObserveInt64(reads, s.PrimaryReads, primary)
		return nil
	}, lagEvents, lagSeconds, fallingBack, reads)
	if err = errors.Join(err1, err2, err3, err4, err); err != nil {
		otel.Handle(err)
	}
	if reg == nil {
		return func() {}
	}
	return func() { _ = reg.Unregister() }
}
