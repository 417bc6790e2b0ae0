package observability

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/kumi-run/kumi/internal/obsname"
)

// Options configures New. Every field is optional.
type Options struct {
	// TracerProvider provides kumi's tracer; nil means otel's global
	// provider, a no-op unless the application (or Setup) configured one.
	TracerProvider trace.TracerProvider
	// MeterProvider provides kumi's meter; nil means otel's global provider.
	MeterProvider metric.MeterProvider
	// Logger receives the few records kumi's hooks log (ownership lost,
	// supervision decisions, overflows, reconnects); nil means slog.Default().
	Logger *slog.Logger
}

// Telemetry is kumi's instrumentation: the runtime calls its hooks at the
// points where something observable happens, and Telemetry turns them into
// spans, metrics and (a few) log records. It holds no goroutine and is safe
// for concurrent use. A nil *Telemetry is valid and records nothing, so a
// component can take one optionally.
//
// With no provider configured, every hook costs a no-op span and no-op
// metric calls — and the delivery hooks no span at all while otel's global
// tracer provider, which New took, has not been set: attributes are only
// built for recording spans, and metric attribute sets on the delivery
// path are built once per bucket.
type Telemetry struct {
	tracer trace.Tracer
	meter  metric.Meter
	logger *slog.Logger
	inst   instruments
	reg    metric.Registration

	mu      sync.Mutex
	next    uint64
	sources map[uint64]func() SubscriptionStatus

	cache sync.Map // measureKey → *measure; read on every delivery, so lock-free

	// unset is otel's global delegating provider when kumi's tracer came
	// from it before any provider was set, nil otherwise. While
	// otel.GetTracerProvider still returns it, every span would be a
	// non-recording one that nothing exports, and StartDelivery starts
	// none; once the application sets a provider, the delegating tracer
	// hands its spans to it.
	unset trace.TracerProvider
}

// New returns a Telemetry using the providers in o. Instrument creation
// errors (none happen with the SDK and kumi's fixed names) are reported to
// otel.Handle and leave the affected instrument a no-op.
func New(o Options) *Telemetry {
	tp, mp, lg := o.TracerProvider, o.MeterProvider, o.Logger
	var unset trace.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
		if isOtelDefault(tp) {
			unset = tp
		}
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if lg == nil {
		lg = slog.Default()
	}
	t := &Telemetry{
		tracer:  tp.Tracer(obsname.ScopeName),
		unset:   unset,
		meter:   mp.Meter(obsname.ScopeName),
		logger:  lg,
		sources: map[uint64]func() SubscriptionStatus{},
	}
	var err error
	t.inst, err = newInstruments(t.meter)
	reg, rerr := t.meter.RegisterCallback(t.observe,
		t.inst.bucketsOwned, t.inst.lagEvents, t.inst.lagSeconds, t.inst.queueDepth, t.inst.queueBytes, t.inst.parkedStreams)
	if err = errors.Join(err, rerr); err != nil {
		otel.Handle(err)
	}
	t.reg = reg
	return t
}

// isOtelDefault reports whether tp is the delegating provider otel's
// global returns before one is set (a type of otel's internal/global
// package). Should otel rename it, kumi merely starts delivery spans
// always, as before.
func isOtelDefault(tp trace.TracerProvider) bool {
	t := reflect.TypeOf(tp)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// tracing reports whether delivery spans may record: a provider was given,
// or the global one has been set since New.
func (t *Telemetry) tracing() bool { return t.unset == nil || otel.GetTracerProvider() != t.unset }

// Close unregisters the gauge callback from the meter provider. Spans and
// counters still work after Close; only the gauges stop reporting. Call it
// when the Telemetry is dropped but its provider lives on (tests, or
// re-creating the runtime in one process).
func (t *Telemetry) Close() error {
	if t == nil || t.reg == nil {
		return nil
	}
	return t.reg.Unregister()
}

// Tracer returns kumi's tracer, for spans the runtime wants beyond the hooks.
func (t *Telemetry) Tracer() trace.Tracer {
	if t == nil {
		return noopTracer
	}
	return t.tracer
}

// Meter returns kumi's meter.
func (t *Telemetry) Meter() metric.Meter {
	if t == nil {
		return noopMeter
	}
	return t.meter
}

// Logger returns the logger the hooks write to.
func (t *Telemetry) Logger() *slog.Logger {
	if t == nil {
		return discardLogger
	}
	return t.logger
}

// instruments are kumi's metric instruments; see internal/obsname for each name.
type instruments struct {
	bucketsOwned metric.Int64ObservableGauge
	lagEvents    metric.Int64ObservableGauge
	lagSeconds   metric.Float64ObservableGauge
	queueDepth   metric.Int64ObservableGauge
	queueBytes   metric.Int64ObservableGauge

	overflows metric.Int64Counter
	dropped   metric.Int64Counter

	delivered    metric.Int64Counter
	acked        metric.Int64Counter
	retried      metric.Int64Counter
	deadLettered metric.Int64Counter
	handlerDur   metric.Float64Histogram

	ownership    metric.Int64Counter
	leaseOps     metric.Int64Counter
	leaseDur     metric.Float64Histogram
	passesLate   metric.Int64Counter
	rebalances   metric.Int64Counter
	reconcileDur metric.Float64Histogram

	fetchDur    metric.Float64Histogram
	fetchEvents metric.Int64Counter

	reconnects metric.Int64Counter
	decisions  metric.Int64Counter
	restarts   metric.Int64Counter

	parkedStreams  metric.Int64ObservableGauge
	parkedReleases metric.Int64Counter
}

// durationBuckets suit database round trips and handler calls, in seconds
// (the SDK's default boundaries assume milliseconds).
var durationBuckets = []float64{
	0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30,
}

func newInstruments(m metric.Meter) (instruments, error) {
	var (
		i    instruments
		errs []error
	)
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit(obsname.UnitSeconds), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(durationBuckets...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		g, err := m.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	var err error
	i.bucketsOwned = gauge(obsname.MetricBucketsOwned, obsname.UnitBucket, "Buckets this worker owns, per subscription.")
	i.lagEvents = gauge(obsname.MetricLagEvents, obsname.UnitEvent, "Events past the bucket's checkpoint.")
	i.lagSeconds, err = m.Float64ObservableGauge(obsname.MetricLagSeconds, metric.WithUnit(obsname.UnitSeconds),
		metric.WithDescription("Age of the oldest event past the bucket's checkpoint (0 when caught up)."))
	errs = append(errs, err)
	i.queueDepth = gauge(obsname.MetricQueueDepth, obsname.UnitBatch, "Live batches waiting in the bucket reader's queue (kumi.queue.bytes: their bytes).")
	i.queueBytes = gauge(obsname.MetricQueueBytes, obsname.UnitBytes, "Bytes waiting in the bucket reader's queue (bounded by GroupOptions.QueueBytes).")

	i.overflows = counter(obsname.MetricQueueOverflows, obsname.UnitOverflow, "Reader queue overflows, per policy.")
	i.dropped = counter(obsname.MetricQueueDropped, obsname.UnitBatch, "Live batches dropped from reader queues by overflows, pauses and DropOldest evictions (the readers re-read them).")

	i.delivered = counter(obsname.MetricEventsDelivered, obsname.UnitEvent, "Deliveries to the handler (every attempt).")
	i.acked = counter(obsname.MetricEventsAcked, obsname.UnitEvent, "Deliveries the handler acknowledged.")
	i.retried = counter(obsname.MetricEventsRetried, obsname.UnitEvent, "Deliveries to be retried (retry, panic, timeout).")
	i.deadLettered = counter(obsname.MetricEventsDeadLettered, obsname.UnitEvent, "Events written to the dead-letter table.")
	i.handlerDur = histogram(obsname.MetricHandlerDuration, "Time from delivery to the handler's reply.")

	i.ownership = counter(obsname.MetricOwnershipChanges, obsname.UnitChange, "Ownership changes, per kind.")
	i.leaseOps = counter(obsname.MetricLeaseOperations, obsname.UnitOperation, "Lease-store operations, per operation and outcome.")
	i.leaseDur = histogram(obsname.MetricLeaseDuration, "Lease-store operation latency.")
	i.passesLate = counter(obsname.MetricLeasePassesLate, obsname.UnitPass, "Lease passes that ran late: longer than the heartbeat, or more than two heartbeats after the last good one.")
	i.rebalances = counter(obsname.MetricRebalances, obsname.UnitRebalance, "Reconcile passes that changed this worker's set of buckets.")
	i.reconcileDur = histogram(obsname.MetricReconcileDuration, "Reconcile pass duration.")

	i.parkedStreams = gauge(obsname.MetricParkedStreams, obsname.UnitStream, "Parked streams the bucket's reader holds: their events wait until an operator releases them.")
	i.parkedReleases = counter(obsname.MetricParkedReleases, obsname.UnitRelease, "Parked streams' releases that ended, their events flowing again, per action.")

	i.fetchDur = histogram(obsname.MetricFetchDuration, "Event-store reads by the publisher and by catching-up readers.")
	i.fetchEvents = counter(obsname.MetricFetchEvents, obsname.UnitEvent, "Events read by the publisher and by catching-up readers.")

	i.reconnects = counter(obsname.MetricNotifierReconnects, obsname.UnitReconnect, "Reconnects of the notifier's LISTEN connection.")
	i.decisions = counter(obsname.MetricSupervisionDecision, obsname.UnitDecision, "Supervision decisions, per actor kind and directive.")
	i.restarts = counter(obsname.MetricSupervisionRestarts, obsname.UnitRestart, "Actor restarts decided by supervision.")
	return i, errors.Join(errs...)
}

// measure is a pre-built attribute set for the hot paths, boxed once so a
// measurement allocates nothing.
type measure struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

type measureKind uint8

const (
	measureBucket        measureKind = iota // subscription, bucket
	measureHandler                          // subscription, outcome
	measureRetry                            // subscription, bucket, outcome
	measureOverflow                         // subscription, policy
	measureFetch                            // source, outcome
	measureFetchCount                       // source
	measureOwnershipKind                    // subscription, change
)

type measureKey struct {
	kind   measureKind
	sub    string
	bucket int
	s      string
}

func (t *Telemetry) measure(k measureKey) *measure {
	if m, ok := t.cache.Load(k); ok {
		return m.(*measure)
	}
	var kv []attribute.KeyValue
	switch k.kind {
	case measureBucket:
		kv = append([]attribute.KeyValue{attribute.String(obsname.AttrSubscription, k.sub)}, bucketAttrs(k.bucket)...)
	case measureHandler:
		kv = []attribute.KeyValue{attribute.String(obsname.AttrSubscription, k.sub), attribute.String(obsname.AttrOutcome, k.s)}
	case measureRetry:
		kv = append([]attribute.KeyValue{attribute.String(obsname.AttrSubscription, k.sub), attribute.String(obsname.AttrOutcome, k.s)}, bucketAttrs(k.bucket)...)
	case measureOverflow:
		kv = []attribute.KeyValue{attribute.String(obsname.AttrSubscription, k.sub), attribute.String(obsname.AttrPolicy, k.s)}
	case measureFetch:
		kv = []attribute.KeyValue{attribute.String(obsname.AttrSource, k.sub), attribute.String(obsname.AttrOutcome, k.s)}
	case measureFetchCount:
		kv = []attribute.KeyValue{attribute.String(obsname.AttrSource, k.sub)}
	case measureOwnershipKind:
		kv = []attribute.KeyValue{attribute.String(obsname.AttrSubscription, k.sub), attribute.String(obsname.AttrChange, k.s)}
	}
	opt := metric.WithAttributeSet(attribute.NewSet(kv...))
	m, _ := t.cache.LoadOrStore(k, &measure{add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}})
	return m.(*measure)
}

// recording reports whether ctx's span records, i.e. whether it is worth
// building attributes for it.
func recording(ctx context.Context) (trace.Span, bool) {
	s := trace.SpanFromContext(ctx)
	return s, s.IsRecording()
}

func outcomeOf(err error) string {
	if err != nil {
		return obsname.OutcomeError
	}
	return obsname.OutcomeOK
}
