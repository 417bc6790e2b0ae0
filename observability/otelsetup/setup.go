package otelsetup

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Options configures Setup. Every field is optional; the environment
// decides the rest.
type Options struct {
	// ServiceName is service.name when OTEL_SERVICE_NAME (or service.name
	// in OTEL_RESOURCE_ATTRIBUTES) is unset; empty means "kumi".
	ServiceName string
	// ServiceVersion, if set, becomes service.version.
	ServiceVersion string
	// Registerer receives the Prometheus exporter's collector; nil means
	// prometheus.DefaultRegisterer, which observability.Handler serves by default.
	Registerer prometheus.Registerer
	// SpanExporter, if set, replaces the exporter chosen from the
	// environment (tests, or an exporter kumi does not build in).
	SpanExporter sdktrace.SpanExporter
	// Logger receives OpenTelemetry's internal errors (failed exports) at
	// Warn, and notes about unsupported settings; nil means slog.Default().
	Logger *slog.Logger
}

// Setup configures OpenTelemetry the standard way, from the environment,
// and installs the result as otel's globals — which observability.New uses when given no
// providers:
//
//   - Traces: exported with OTLP when OTEL_TRACES_EXPORTER is "otlp", or is
//     unset and OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; over HTTP/protobuf unless
//     OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL is "grpc". The exporter reads the
//     other OTEL_EXPORTER_OTLP_* variables (headers, timeout, TLS) and the
//     SDK reads OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*. Otherwise no
//     tracer provider is installed: spans cost a no-op, and trace context
//     still flows from appender to handler through event metadata.
//     Without a collector: OTEL_TRACES_EXPORTER "console" writes each span
//     as a line of JSON to stdout, and "file" (or KUMI_TRACES_FILE set with
//     OTEL_TRACES_EXPORTER unset) appends them to the file KUMI_TRACES_FILE
//     names — several processes may share one (`jq` reads it).
//   - Metrics: a Prometheus exporter (pull, served by observability.Handler's /metrics)
//     unless OTEL_METRICS_EXPORTER is "none".
//   - Resource: service.name from OTEL_SERVICE_NAME or o.ServiceName, plus
//     OTEL_RESOURCE_ATTRIBUTES, the SDK's and the host's attributes.
//   - Propagation: W3C TraceContext and Baggage.
//   - OTEL_SDK_DISABLED=true installs nothing but the propagator.
//
// Unsupported exporter names are logged and treated as "none". The returned
// shutdown flushes pending spans and stops the providers; call it before the
// process exits. Setup is meant to be called once per process.
func Setup(ctx context.Context, o Options) (shutdown func(context.Context) error, err error) {
	lg := o.Logger
	if lg == nil {
		lg = slog.Default()
	}
	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
		propagation.TraceContext{}, propagation.Baggage{}))
	nothing := func(context.Context) error { return nil }
	if strings.EqualFold(strings.TrimSpace(os.Getenv("OTEL_SDK_DISABLED")), "true") {
		return nothing, nil
	}

	name := o.ServiceName
	if name == "" {
		name = "kumi"
	}
	defaults := []attribute.KeyValue{attribute.String("service.name", name)}
	if o.ServiceVersion != "" {
		defaults = append(defaults, attribute.String("service.version", o.ServiceVersion))
	}
	// Later options win: the environment overrides the defaults.
	res, err := resource.New(ctx,
		resource.WithAttributes(defaults...),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithFromEnv(),
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("otelsetup: resource: %w", err)
	}

	exp := o.SpanExporter
	if exp == nil {
		exp, err = spanExporterFromEnv(ctx, lg)
		if err != nil {
			return nil, err
		}
	}

	var shutdowns []func(context.Context) error
	if exp != nil {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		otel.SetTracerProvider(tp)
		shutdowns = append(shutdowns, tp.Shutdown)
	}

	switch m := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_METRICS_EXPORTER"))); m {
	case "", "prometheus":
		reg := o.Registerer
		if reg == nil {
			reg = prometheus.DefaultRegisterer
		}
		pe, err := promexporter.New(promexporter.WithRegisterer(reg))
		if err != nil {
			return nil, errors.Join(fmt.Errorf("otelsetup: prometheus exporter: %w", err), shutdownAll(ctx, shutdowns))
		}
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(pe), sdkmetric.WithResource(res))
		otel.SetMeterProvider(mp)
		shutdowns = append(shutdowns, mp.Shutdown)
	case "none":
	default:
		lg.Warn("otelsetup: unsupported OTEL_METRICS_EXPORTER, metrics disabled", slog.String("value", m))
	}

	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) {
		lg.Warn("opentelemetry", slog.Any("err", err))
	}))

	var once sync.Once
	var serr error
	return func(ctx context.Context) error {
		once.Do(func() { serr = shutdownAll(ctx, shutdowns) })
		return serr
	}, nil
}

func shutdownAll(ctx context.Context, fs []func(context.Context) error) error {
	var errs []error
	for i := len(fs) - 1; i >= 0; i-- {
		errs = append(errs, fs[i](ctx))
	}
	return errors.Join(errs...)
}

// spanExporterFromEnv returns the exporter the environment asks for, or nil
// for none.
func spanExporterFromEnv(ctx context.Context, lg *slog.Logger) (sdktrace.SpanExporter, error) {
	exporter := strings.ToLower(strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")))
	file := os.Getenv("KUMI_TRACES_FILE")
	if exporter == "" {
		switch {
		case file != "":
			exporter = "file"
		case os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "":
			return nil, nil
		default:
			exporter = "otlp"
		}
	}
	switch exporter {
	case "none":
		return nil, nil
	case "console":
		exp, err := stdouttrace.New(stdouttrace.WithWriter(os.Stdout))
		if err != nil {
			return nil, fmt.Errorf("otelsetup: console exporter: %w", err)
		}
		return exp, nil
	case "file":
		if file == "" {
			return nil, errors.New("otelsetup: OTEL_TRACES_EXPORTER=file needs KUMI_TRACES_FILE, the file to append the spans to")
		}
		return newFileExporter(file)
	case "otlp":
	default:
		lg.Warn("otelsetup: unsupported OTEL_TRACES_EXPORTER, tracing disabled", slog.String("value", exporter))
		return nil, nil
	}
	protocol := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.ToLower(strings.TrimSpace(protocol)) {
	case "", "http/protobuf":
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otelsetup: otlp http exporter: %w", err)
		}
		return exp, nil
	case "grpc":
		exp, err := otlptracegrpc.New(ctx)
		if err != nil {
			return nil, fmt.Errorf("otelsetup: otlp grpc exporter: %w", err)
		}
		return exp, nil
	default:
		return nil, fmt.Errorf("otelsetup: unsupported OTLP protocol %q (want http/protobuf or grpc)", protocol)
	}
}

// fileExporter appends spans to a file as lines of JSON, and closes it
// when shut down.
type fileExporter struct {
	*stdouttrace.Exporter
	f *os.File
}

func newFileExporter(path string) (sdktrace.SpanExporter, error) {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("otelsetup: KUMI_TRACES_FILE: %w", err)
	}
	exp, err := stdouttrace.New(stdouttrace.WithWriter(f))
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("otelsetup: file exporter: %w", err)
	}
	return &fileExporter{Exporter: exp, f: f}, nil
}

// Shutdown flushes nothing more (every export is written at once) and
// closes the file.
func (e *fileExporter) Shutdown(ctx context.Context) error {
	return errors.Join(e.Exporter.Shutdown(ctx), e.f.Close())
}
