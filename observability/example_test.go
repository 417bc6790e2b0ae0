package observability_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

// printSpans prints ended spans as a tree, in start order, with the given
// attributes.
func printSpans(spans tracetest.SpanStubs, keys ...string) {
	ids := map[string]bool{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID().String()] = true
	}
	children := map[string]tracetest.SpanStubs{}
	for _, s := range spans {
		p := s.Parent.SpanID().String()
		if !ids[p] {
			p = ""
		}
		children[p] = append(children[p], s)
	}
	var walk func(parent string, depth int)
	walk = func(parent string, depth int) {
		kids := children[parent]
		sort.Slice(kids, func(i, j int) bool { return kids[i].StartTime.Before(kids[j].StartTime) })
		for _, s := range kids {
			var parts []string
			a := attrs(s)
			for _, k := range keys {
				if v, ok := a[k]; ok {
					parts = append(parts, fmt.Sprintf("%s=%v", k, v))
				}
			}
			fmt.Println(strings.TrimRight(strings.Repeat("  ", depth)+s.Name+" "+strings.Join(parts, " "), " "))
			walk(s.SpanContext.SpanID().String(), depth+1)
		}
	}
	walk("", 0)
}

// A coordinator's reconcile pass with the ownership changes it made.
func ExampleTelemetry_OwnershipChange() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tel := observability.New(observability.Options{TracerProvider: tp, Logger: slog.New(slog.DiscardHandler)})
	defer tel.Close()

	ctx, pass := tel.StartReconcile(context.Background(), "orders", "worker-a")
	tel.OwnershipChange(ctx, observability.OwnershipChange{
		Kind: observability.ChangeClaim, Subscription: "orders", Bucket: 0, Worker: "worker-a", Epoch: 1,
		Reason: "free"})
	tel.OwnershipChange(ctx, observability.OwnershipChange{
		Kind: observability.ChangeSteal, Subscription: "orders", Bucket: 1, Worker: "worker-a", Epoch: 5,
		Peer: "worker-c", Evidence: "session_gone"})
	tel.OwnershipChange(ctx, observability.OwnershipChange{
		Kind: observability.ChangeHandoffGive, Subscription: "orders", Bucket: 2, Worker: "worker-a", Epoch: 3,
		Peer: "worker-b", Reason: "over fair share 2"})
	pass.End(observability.PassSummary{LiveWorkers: 2, FairShare: 2, Owned: 2, Claimed: 1, Stolen: 1, Given: 1})

	printSpans(spans.GetSpans(), obsname.AttrBucket, obsname.AttrEpoch,
		obsname.AttrPeer, obsname.AttrEvidence, obsname.AttrOwned)
	// Output:
	// kumi.reconcile kumi.owned=2
	//   kumi.lease.claim kumi.bucket=0 kumi.epoch=1
	//   kumi.lease.steal kumi.bucket=1 kumi.epoch=5 kumi.peer=worker-c kumi.evidence=session_gone
	//   kumi.lease.handoff.give kumi.bucket=2 kumi.epoch=3 kumi.peer=worker-b
}

// A delivery joins the trace of the request that appended the event.
func ExampleTelemetry_StartDelivery() {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	tel := observability.New(observability.Options{TracerProvider: tp})
	defer tel.Close()

	// At append time the event store writes the appender's trace context
	// into the event's metadata.
	actx, req := tp.Tracer("api").Start(context.Background(), "POST /orders")
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(actx, carrier)
	metadata, _ := json.Marshal(carrier)
	req.End()

	// At delivery time the reader restores it and opens the delivery span.
	ctx := eventsource.TraceContext(context.Background(), metadata)
	ctx, d := tel.StartDelivery(ctx, observability.DeliveryInfo{
		Subscription: "orders", Bucket: 2, Worker: "worker-a", Category: "order",
		Stream: "order-17", EventID: "0190f2e4-6c1a-7d3e-9b2a-3f4e5d6c7b8a", EventType: "Placed",
		Position: 42, Attempt: 1})
	_ = ctx // the handler's own spans nest under the delivery
	d.End(observability.OutcomeAck, nil)

	printSpans(spans.GetSpans(), obsname.AttrBucket, obsname.AttrPosition,
		obsname.AttrAttempt, obsname.AttrOutcome)
	// Output:
	// POST /orders
	//   kumi.deliver kumi.bucket=2 kumi.position=42 kumi.attempt=1 kumi.outcome=ack
}

// A handler that panicked: the runtime recovers and ends the delivery.
func ExampleDeliverySpan_EndPanic() {
	spans := tracetest.NewInMemoryExporter()
	tel := observability.New(observability.Options{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))})
	defer tel.Close()

	func() {
		_, d := tel.StartDelivery(context.Background(), observability.DeliveryInfo{Subscription: "orders", Attempt: 3})
		defer func() {
			if r := recover(); r != nil {
				d.EndPanic(r, nil) // pass debug.Stack() in real code
			}
		}()
		panic("nil map")
	}()
	s := spans.GetSpans()[0]
	fmt.Println(s.Name, attrs(s)[obsname.AttrOutcome], s.Status.Code, s.Events[0].Name)
	// Output: kumi.deliver panic Error exception
}

// The publisher's read, with an overflow that happened while fanning it out,
// and a catching-up reader's read.
func ExampleTelemetry_StartPublisherFetch() {
	spans := tracetest.NewInMemoryExporter()
	tel := observability.New(observability.Options{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))})
	defer tel.Close()

	ctx, f := tel.StartPublisherFetch(context.Background(), 1000, 4)
	tel.Overflow(ctx, observability.OverflowInfo{
		Subscription: "orders", Bucket: 3, Policy: obsname.PolicyPauseAndResume,
		Depth: 256, Capacity: 256, Dropped: 256})
	f.End(120, 1120, nil)

	_, f = tel.StartReaderFetch(context.Background(), "orders", 3, 800)
	f.End(500, 1300, nil)

	for _, s := range spans.GetSpans() {
		fmt.Println(s.Name, attrs(s)[obsname.AttrCount], len(s.Events))
	}
	// Output:
	// kumi.publisher.fetch 120 1
	// kumi.reader.fetch 500 0
}

// A supervisor reports its decision; outside any span it gets a short one.
func ExampleTelemetry_SupervisionDecision() {
	spans := tracetest.NewInMemoryExporter()
	tel := observability.New(observability.Options{
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans)),
		Logger:         slog.New(slog.DiscardHandler)})
	defer tel.Close()

	tel.SupervisionDecision(context.Background(), observability.SupervisionInfo{
		Actor: "reader", Child: "reader-orders-3", Subscription: "orders", Strategy: "one_for_one",
		Directive: obsname.DirectiveRestart, Reason: errors.New("connection refused"),
		Restarts: 2, Backoff: 400 * time.Millisecond})
	tel.NotifierReconnect(context.Background(), 1, errors.New("unexpected EOF"))

	s := spans.GetSpans()[0]
	fmt.Println(s.Name, attrs(s)[obsname.AttrDirective], attrs(s)[obsname.AttrBackoff])
	// Output: kumi.supervision restart 0.4
}

// A coordinator registers a snapshot of its status; the gauges and /status
// read it.
func ExampleTelemetry_RegisterStatus() {
	reader := sdkmetric.NewManualReader()
	tel := observability.New(observability.Options{
		MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	defer tel.Close()

	unregister := tel.RegisterStatus(func() observability.SubscriptionStatus {
		// Real code returns a snapshot the coordinator keeps (an
		// atomic.Pointer), never asks the actor.
		return observability.SubscriptionStatus{
			Subscription: "orders", Worker: "worker-a", Buckets: 4, LiveWorkers: 2,
			Owned: []observability.BucketStatus{
				{Bucket: 0, Epoch: 1, State: "live", Checkpoint: 990, LagEvents: 10, LagSeconds: 0.2},
				{Bucket: 1, Epoch: 5, State: "catching_up", Checkpoint: 500, LagEvents: 500, LagSeconds: 30},
			},
		}
	})
	defer unregister()

	var rm metricdata.ResourceMetrics
	_ = reader.Collect(context.Background(), &rm)
	for _, m := range rm.ScopeMetrics[0].Metrics {
		if m.Name == obsname.MetricBucketsOwned {
			fmt.Println(m.Name, m.Data.(metricdata.Gauge[int64]).DataPoints[0].Value)
		}
	}
	fmt.Println(tel.Status()[0].Owned[1].State)
	// Output:
	// kumi.buckets.owned 2
	// catching_up
}

// Handler can be mounted on a service's own mux.
func ExampleHandler() {
	tel := observability.New(observability.Options{})
	defer tel.Close()
	tel.RegisterStatus(func() observability.SubscriptionStatus {
		return observability.SubscriptionStatus{Subscription: "orders", Worker: "worker-a", Buckets: 2,
			Owned: []observability.BucketStatus{{Bucket: 1, Slot: 1, Epoch: 7, State: "live", Checkpoint: 42}}}
	})
	mux := http.NewServeMux()
	mux.Handle("/ops/", http.StripPrefix("/ops", observability.Handler(observability.HandlerOptions{
		Gatherer:  prometheus.NewRegistry(),
		Telemetry: tel,
		Healthy:   func(context.Context) error { return nil },
	})))

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- observability.ServeListener(ctx, ln, mux) }()
	client := &http.Client{}
	for _, path := range []string{"/ops/healthz", "/ops/status"} {
		resp, err := client.Get("http://" + ln.Addr().String() + path)
		if err != nil {
			log.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if path == "/ops/status" {
			var page struct {
				Subscriptions []observability.SubscriptionStatus `json:"subscriptions"`
			}
			_ = json.Unmarshal(body, &page)
			b, _ := json.Marshal(page.Subscriptions)
			body = b
		}
		fmt.Printf("%s %d %s\n", path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	client.CloseIdleConnections()
	cancel()
	fmt.Println(<-done)
	// Output:
	// /ops/healthz 200 ok
	// /ops/status 200 [{"subscription":"orders","worker":"worker-a","buckets":2,"owned":[{"generation":0,"bucket":1,"slot":1,"epoch":7,"state":"live","checkpoint":42,"lag_events":0,"lag_seconds":0,"queue_depth":0,"queue_bytes":0}]}]
	// <nil>
}

// Serve runs the handler until its context ends.
func ExampleServe() {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := observability.Serve(ctx, "127.0.0.1:0", observability.Handler(observability.HandlerOptions{
		Gatherer: prometheus.NewRegistry()}))
	fmt.Println(err)
	// Output: <nil>
}

// protoactor-go's own logging goes through the application's slog logger,
// its Info chatter demoted to Debug.
func ExampleProtoactorLoggerFactory() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		Level: slog.LevelDebug,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey || a.Key == "actor_system" || a.Key == "id" {
				return slog.Attr{}
			}
			return a
		},
	}))
	system := actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(logger)))
	system.Shutdown()
	// Output: level=DEBUG msg="actor system started" lib=protoactor
}
