package jaegertest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Trace is one trace as Jaeger returns it.
type Trace struct {
	TraceID string
	Spans   []Span
}

// Span is one span with its tags decoded. Jaeger renders OpenTelemetry
// attributes as tags; it adds a few of its own (span.kind, otel.scope.name,
// otel.status_code, error).
type Span struct {
	TraceID      string
	SpanID       string
	ParentSpanID string // "" for a root span
	Operation    string // the span name
	Service      string // service.name of the process that exported it
	Start        time.Time
	Duration     time.Duration
	// Tags maps an attribute key to its value: string, bool, int64 or
	// float64.
	Tags map[string]any
	// Events are the span's events (Jaeger "logs"), in order.
	Events []Event
	// References are all of the span's references, CHILD_OF and
	// FOLLOWS_FROM (links), possibly to other traces.
	References []Reference
}

// Event is a span event.
type Event struct {
	Time time.Time
	// Name is the event's name (Jaeger's "event" field).
	Name   string
	Fields map[string]any
}

// Reference is a span reference.
type Reference struct {
	Type    string // CHILD_OF or FOLLOWS_FROM
	TraceID string
	SpanID  string
}

// Tag returns the value of tag key, formatted as a string ("" if absent),
// which suits assertions on strings and integers alike.
func (s Span) Tag(key string) string {
	v, ok := s.Tags[key]
	if !ok {
		return ""
	}
	switch v := v.(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	}
	return fmt.Sprint(v)
}

// Int returns the value of an integer tag.
func (s Span) Int(key string) (int64, bool) {
	v, ok := s.Tags[key].(int64)
	return v, ok
}

// HasTag reports whether the span has tag key.
func (s Span) HasTag(key string) bool {
	_, ok := s.Tags[key]
	return ok
}

// Option narrows a query.
type Option func(*query)

type query struct {
	operation string
	tags      map[string]string
	limit     int
	lookback  time.Duration
	start     time.Time
	interval  time.Duration
	client    *http.Client
}

// WithOperation keeps traces containing a span named name.
func WithOperation(name string) Option { return func(q *query) { q.operation = name } }

// WithTag keeps traces containing a span with tag key=value (all such tags
// must match on one span).
func WithTag(key, value string) Option {
	return func(q *query) {
		if q.tags == nil {
			q.tags = map[string]string{}
		}
		q.tags[key] = value
	}
}

// Limit caps the number of traces returned (Jaeger's default is 20 —
// WaitForSpans and QueryTraces use 1000 unless told otherwise).
func Limit(n int) Option { return func(q *query) { q.limit = n } }

// Lookback searches traces started within d before now (default one hour).
func Lookback(d time.Duration) Option { return func(q *query) { q.lookback = d } }

// Since searches traces started at or after t (overrides Lookback).
func Since(t time.Time) Option { return func(q *query) { q.start = t } }

// PollInterval sets WaitForSpans' polling interval (default 250 ms).
func PollInterval(d time.Duration) Option { return func(q *query) { q.interval = d } }

// WithClient sets the HTTP client (default http.DefaultClient).
func WithClient(c *http.Client) Option { return func(q *query) { q.client = c } }

func newQuery(opts []Option) *query {
	q := &query{limit: 1000, lookback: time.Hour, interval: 250 * time.Millisecond, client: http.DefaultClient}
	for _, o := range opts {
		o(q)
	}
	return q
}

// QueryTraces returns the traces of service that match the options, from
// the Jaeger query service at baseURL (e.g. "http://127.0.0.1:16686"). A
// service Jaeger has never seen yields no traces and no error.
func QueryTraces(ctx context.Context, baseURL, service string, opts ...Option) ([]Trace, error) {
	return newQuery(opts).traces(ctx, baseURL, service)
}

// Spans returns the spans of every trace, in start order.
func Spans(traces []Trace) []Span {
	var out []Span
	for _, t := range traces {
		out = append(out, t.Spans...)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// QuerySpans is QueryTraces followed by Spans.
func QuerySpans(ctx context.Context, baseURL, service string, opts ...Option) ([]Span, error) {
	ts, err := QueryTraces(ctx, baseURL, service, opts...)
	if err != nil {
		return nil, err
	}
	return Spans(ts), nil
}

// WaitForSpans polls QuerySpans until done returns true for the spans
// found, and returns them; or returns ctx's error (with the last spans seen)
// when ctx ends first. Exporters batch, so spans appear a little after they
// end.
func WaitForSpans(ctx context.Context, baseURL, service string, done func([]Span) bool, opts ...Option) ([]Span, error) {
	q := newQuery(opts)
	var last []Span
	for {
		ts, err := q.traces(ctx, baseURL, service)
		if err == nil {
			last = Spans(ts)
			if done(last) {
				return last, nil
			}
		}
		select {
		case <-ctx.Done():
			if err != nil {
				return last, fmt.Errorf("jaegertest: %w (last query: %v)", ctx.Err(), err)
			}
			return last, fmt.Errorf("jaegertest: %w waiting for spans of %q (%d seen)", ctx.Err(), service, len(last))
		case <-time.After(q.interval):
		}
	}
}

// Filter returns the spans for which every predicate holds.
func Filter(spans []Span, preds ...func(Span) bool) []Span {
	var out []Span
next:
	for _, s := range spans {
		for _, p := range preds {
			if !p(s) {
				continue next
			}
		}
		out = append(out, s)
	}
	return out
}

// Operation is a Filter predicate: the span is named name.
func Operation(name string) func(Span) bool {
	return func(s Span) bool { return s.Operation == name }
}

// Tagged is a Filter predicate: the span's tag key, formatted by Tag,
// equals value.
func Tagged(key, value string) func(Span) bool {
	return func(s Span) bool { return s.HasTag(key) && s.Tag(key) == value }
}

// Services lists the services Jaeger has seen. Of the options only
// WithClient applies.
func Services(ctx context.Context, baseURL string, opts ...Option) ([]string, error) {
	var resp struct {
		Data []string `json:"data"`
	}
	if err := get(ctx, newQuery(opts).client, strings.TrimRight(baseURL, "/")+"/api/services", &resp); err != nil {
		return nil, err
	}
	return resp.Data, nil
}

// Ready returns nil if the query service at baseURL answers. Of the
// options only WithClient applies.
func Ready(ctx context.Context, baseURL string, opts ...Option) error {
	_, err := Services(ctx, baseURL, opts...)
	return err
}

func (q *query) traces(ctx context.Context, baseURL, service string) ([]Trace, error) {
	v := url.Values{}
	v.Set("service", service)
	if q.operation != "" {
		v.Set("operation", q.operation)
	}
	if len(q.tags) > 0 {
		b, err := json.Marshal(q.tags)
		if err != nil {
			return nil, err
		}
		v.Set("tags", string(b))
	}
	v.Set("limit", strconv.Itoa(q.limit))
	end := time.Now().Add(time.Minute)
	start := q.start
	if start.IsZero() {
		start = end.Add(-q.lookback - time.Minute)
	}
	v.Set("start", strconv.FormatInt(start.UnixMicro(), 10))
	v.Set("end", strconv.FormatInt(end.UnixMicro(), 10))

	var resp apiResponse
	if err := get(ctx, q.client, strings.TrimRight(baseURL, "/")+"/api/traces?"+v.Encode(), &resp); err != nil {
		// Jaeger answers 404 for a service it has not seen yet… in some
		// versions; treat that as no traces.
		if he, ok := err.(*httpError); ok && he.status == http.StatusNotFound && bytes.Contains(he.body, []byte("service")) {
			return nil, nil
		}
		return nil, err
	}
	return resp.traces()
}

type httpError struct {
	url    string
	status int
	body   []byte
}

func (e *httpError) Error() string {
	return fmt.Sprintf("jaegertest: GET %s: %d %s", e.url, e.status, bytes.TrimSpace(e.body))
}

func get(ctx context.Context, c *http.Client, u string, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("jaegertest: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 256<<20))
	if err != nil {
		return fmt.Errorf("jaegertest: GET %s: %w", u, err)
	}
	if resp.StatusCode != http.StatusOK {
		return &httpError{url: u, status: resp.StatusCode, body: body}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if err := dec.Decode(into); err != nil {
		return fmt.Errorf("jaegertest: GET %s: decode: %w", u, err)
	}
	return nil
}

// apiResponse is the query service's JSON (the "UI model").
type apiResponse struct {
	Data   []apiTrace `json:"data"`
	Errors []struct {
		Code    int    `json:"code"`
		Msg     string `json:"msg"`
		TraceID string `json:"traceID"`
	} `json:"errors"`
}

type apiTrace struct {
	TraceID   string                `json:"traceID"`
	Spans     []apiSpan             `json:"spans"`
	Processes map[string]apiProcess `json:"processes"`
}

type apiSpan struct {
	TraceID       string `json:"traceID"`
	SpanID        string `json:"spanID"`
	OperationName string `json:"operationName"`
	References    []struct {
		RefType string `json:"refType"`
		TraceID string `json:"traceID"`
		SpanID  string `json:"spanID"`
	} `json:"references"`
	StartTime json.Number `json:"startTime"` // µs since the epoch
	Duration  json.Number `json:"duration"`  // µs
	Tags      []apiKV     `json:"tags"`
	Logs      []struct {
		Timestamp json.Number `json:"timestamp"`
		Fields    []apiKV     `json:"fields"`
	} `json:"logs"`
	ProcessID string `json:"processID"`
}

type apiProcess struct {
	ServiceName string  `json:"serviceName"`
	Tags        []apiKV `json:"tags"`
}

type apiKV struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

func (kv apiKV) value() any {
	switch v := kv.Value.(type) {
	case json.Number:
		if kv.Type == "float64" {
			f, _ := v.Float64()
			return f
		}
		if i, err := v.Int64(); err == nil {
			return i
		}
		f, _ := v.Float64()
		return f
	default:
		return v
	}
}

func micros(n json.Number) time.Time {
	i, _ := n.Int64()
	return time.UnixMicro(i)
}

func (r apiResponse) traces() ([]Trace, error) {
	if len(r.Errors) > 0 && len(r.Data) == 0 {
		return nil, fmt.Errorf("jaegertest: %s", r.Errors[0].Msg)
	}
	out := make([]Trace, 0, len(r.Data))
	for _, t := range r.Data {
		tr := Trace{TraceID: t.TraceID}
		for _, s := range t.Spans {
			d, _ := s.Duration.Int64()
			sp := Span{
				TraceID:   s.TraceID,
				SpanID:    s.SpanID,
				Operation: s.OperationName,
				Service:   t.Processes[s.ProcessID].ServiceName,
				Start:     micros(s.StartTime),
				Duration:  time.Duration(d) * time.Microsecond,
				Tags:      make(map[string]any, len(s.Tags)),
			}
			for _, kv := range s.Tags {
				sp.Tags[kv.Key] = kv.value()
			}
			for _, ref := range s.References {
				sp.References = append(sp.References, Reference{Type: ref.RefType, TraceID: ref.TraceID, SpanID: ref.SpanID})
				if ref.RefType == "CHILD_OF" && sp.ParentSpanID == "" && ref.TraceID == s.TraceID {
					sp.ParentSpanID = ref.SpanID
				}
			}
			for _, l := range s.Logs {
				ev := Event{Time: micros(l.Timestamp), Fields: map[string]any{}}
				for _, kv := range l.Fields {
					if kv.Key == "event" {
						ev.Name = fmt.Sprint(kv.value())
						continue
					}
					ev.Fields[kv.Key] = kv.value()
				}
				sp.Events = append(sp.Events, ev)
			}
			tr.Spans = append(tr.Spans, sp)
		}
		sort.SliceStable(tr.Spans, func(i, j int) bool { return tr.Spans[i].Start.Before(tr.Spans[j].Start) })
		out = append(out, tr)
	}
	return out, nil
}
