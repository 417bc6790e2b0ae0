package eventsource

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Append writes events to stream atomically, in one statement, if expected
// holds. It never waits on any row but the stream's own, so appends to
// different streams do not serialise. The events get global positions
// shortly after commit, from a [Sequencer].
func (s *Store) Append(ctx context.Context, stream string, expected ExpectedVersion, events []EventData) (AppendResult, error) {
	res, err := s.append(ctx, s.pool, stream, expected, events)
	if err == nil {
		s.signalAppended()
	}
	return res, err
}

// AppendTx is [Store.Append] inside the caller's transaction: the events
// commit or roll back with it. A conflict leaves the transaction usable
// (nothing was written), but an error from PostgreSQL aborts it.
//
// Use READ COMMITTED (PostgreSQL's default): under REPEATABLE READ or
// SERIALIZABLE, an append to a stream that another transaction appended to
// since this one began fails with a serialization error (SQLSTATE 40001),
// to be retried. A transaction that appends to several streams should take
// them in a fixed order (by name, say), or two such transactions can
// deadlock. After the commit, [Store.WakeSequencer] gets the events their
// positions at once rather than at the sequencer's next poll.
func (s *Store) AppendTx(ctx context.Context, tx pgx.Tx, stream string, expected ExpectedVersion, events []EventData) (AppendResult, error) {
	return s.append(ctx, tx, stream, expected, events)
}

// Append statement modes, indexes of queries.append.
const (
	modeAny = iota
	modeNoStream
	modeExists
	modeExact
)

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func (s *Store) append(ctx context.Context, db querier, stream string, expected ExpectedVersion, events []EventData) (AppendResult, error) {
	name, err := ParseStreamName(stream)
	if err != nil {
		return AppendResult{}, err
	}
	if len(events) == 0 {
		return AppendResult{}, &EventError{Index: 0, Reason: "empty batch"}
	}
	if len(events) > s.cfg.MaxBatchEvents {
		return AppendResult{}, &EventError{Index: s.cfg.MaxBatchEvents, Reason: fmt.Sprintf("batch has %d events, more than MaxBatchEvents %d", len(events), s.cfg.MaxBatchEvents)}
	}
	if expected < StreamExists {
		return AppendResult{}, &EventError{Index: 0, Reason: fmt.Sprintf("invalid expected version %d", int64(expected))}
	}
	n := len(events)
	ids := make([]uuid.UUID, n)
	types := make([]string, n)
	datas := make([]string, n)
	metas := make([]*string, n)
	traceMeta := traceMetadata(ctx)
	batchBytes := 0
	for i, e := range events {
		if err := s.checkEvent(i, e); err != nil {
			return AppendResult{}, err
		}
		// Checked before anything is encoded: encoding takes a few times
		// the batch's size in memory.
		if batchBytes += len(e.Data) + len(e.Metadata) + len(e.Type); batchBytes > s.cfg.MaxBatchBytes {
			return AppendResult{}, &EventError{Index: i, Reason: fmt.Sprintf(
				"the batch's events up to this one are %d bytes (data, metadata and types), more than MaxBatchBytes %d",
				batchBytes, s.cfg.MaxBatchBytes)}
		}
		ids[i] = e.ID
		if ids[i] == uuid.Nil {
			if ids[i], err = uuid.NewV7(); err != nil {
				return AppendResult{}, fmt.Errorf("kumi: event id: %w", err)
			}
		}
		types[i] = e.Type
		datas[i] = string(e.Data)
		meta, err := mergeMetadata(e.Metadata, traceMeta)
		if err != nil {
			return AppendResult{}, &EventError{Index: i, Reason: err.Error()}
		}
		metas[i] = meta
		if err := s.checkTextSize(i, e.Data, meta); err != nil {
			return AppendResult{}, err
		}
	}
	hash := Hash(name.CardinalID)
	mode := modeExact
	switch expected {
	case Any:
		mode = modeAny
	case NoStream:
		mode = modeNoStream
	case StreamExists:
		mode = modeExists
	}
	var args []any
	sql := s.sql.append[mode][0]
	if n == 1 {
		sql = s.sql.append[mode][1]
		args = []any{stream, int64(n), ids[0], types[0], datas[0], metas[0], name.Category, name.CardinalID, hash}
	} else {
		args = []any{stream, int64(n), ids, types, datas, metas, name.Category, name.CardinalID, hash}
	}
	if mode == modeExact {
		args = append(args, int64(expected))
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return AppendResult{}, appendError(stream, err)
	}
	var last, inserted int64
	count := 0
	for rows.Next() {
		if err := rows.Scan(&last, &inserted); err != nil {
			rows.Close()
			return AppendResult{}, err
		}
		count++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return AppendResult{}, appendError(stream, err)
	}
	if count == 1 && inserted != int64(n) {
		return AppendResult{}, fmt.Errorf("kumi: append to %q inserted %d of %d events", stream, inserted, n)
	}
	if count == 0 {
		actual := int64(-1)
		err := db.QueryRow(ctx, s.sql.streamVersion, stream).Scan(&actual)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return AppendResult{}, fmt.Errorf("kumi: append to %q: read version: %w", stream, err)
		}
		return AppendResult{}, &WrongExpectedVersionError{Stream: stream, Expected: expected, Actual: actual}
	}
	return AppendResult{IDs: ids, FirstVersion: last - int64(n) + 1, LastVersion: last}, nil
}

// appendError classifies an error of the append statement.
func appendError(stream string, err error) error {
	switch {
	case isUniqueViolation(err, "events_event_id"):
		return fmt.Errorf("%w: an event of the batch to %q already exists", ErrDuplicateEventID, stream)
	case isDataException(err):
		return &EventError{Index: -1, Reason: "PostgreSQL refused the batch: " + err.Error()}
	}
	return fmt.Errorf("kumi: append to %q: %w", stream, err)
}

func (s *Store) checkEvent(i int, e EventData) error {
	if err := ValidateName("event type", e.Type, MaxEventTypeLength); err != nil {
		return &EventError{Index: i, Reason: err.Error(), Err: err}
	}
	if len(e.Data)+len(e.Metadata) > s.cfg.MaxEventSize {
		return &EventError{Index: i, Reason: fmt.Sprintf("data and metadata are %d bytes, more than MaxEventSize %d", len(e.Data)+len(e.Metadata), s.cfg.MaxEventSize)}
	}
	if len(e.Data) == 0 {
		return &EventError{Index: i, Reason: "empty data (use null or {} for none)"}
	}
	if !json.Valid(e.Data) {
		return &EventError{Index: i, Reason: "data is not valid JSON"}
	}
	// encoding/json lets invalid UTF-8 through inside strings; PostgreSQL
	// does not.
	if !utf8.Valid(e.Data) || !utf8.Valid(e.Metadata) {
		return &EventError{Index: i, Reason: "data or metadata is not valid UTF-8"}
	}
	// PostgreSQL's jsonb refuses \u0000, which encoding/json accepts.
	if hasEscapedNUL(e.Data) || hasEscapedNUL(e.Metadata) {
		return &EventError{Index: i, Reason: `JSON contains \u0000, which PostgreSQL cannot store`}
	}
	if len(e.Metadata) > 0 {
		if !json.Valid(e.Metadata) {
			return &EventError{Index: i, Reason: "metadata is not valid JSON"}
		}
		if t := bytes.TrimSpace(e.Metadata); len(t) == 0 || t[0] != '{' {
			if !bytes.Equal(t, []byte("null")) {
				return &EventError{Index: i, Reason: "metadata must be a JSON object"}
			}
		}
	}
	return nil
}

// hasEscapedNUL reports a \u0000 escape in the JSON b: a backslash that
// starts an escape (after an even number of backslashes) followed by
// u0000. "\\u0000" is an escaped backslash and the text u0000, which
// jsonb stores.
func hasEscapedNUL(b []byte) bool {
	for {
		i := bytes.Index(b, []byte(`\u0000`))
		if i < 0 {
			return false
		}
		n := 0
		for j := i - 1; j >= 0 && b[j] == '\\'; j-- {
			n++
		}
		if n%2 == 0 {
			return true
		}
		b = b[i+1:]
	}
}

// checkTextSize bounds what a read of the event will return: its data and
// metadata as jsonb prints them (see textSize), which can be far longer
// than what was given.
func (s *Store) checkTextSize(i int, data json.RawMessage, meta *string) error {
	size := textSize(data)
	if meta != nil {
		size += textSize([]byte(*meta))
	}
	if size > int64(s.cfg.MaxEventSize) {
		return &EventError{Index: i, Reason: fmt.Sprintf(
			"data and metadata read back as %d bytes (jsonb writes numbers out in full: 1e6 as 1000000), more than MaxEventSize %d",
			size, s.cfg.MaxEventSize)}
	}
	return nil
}

// traceMetadata returns the W3C trace context of ctx's span, or nil.
func traceMetadata(ctx context.Context) map[string]string {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return nil
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	return carrier
}

// mergeMetadata adds the trace keys missing from meta.
func mergeMetadata(meta json.RawMessage, trace map[string]string) (*string, error) {
	t := bytes.TrimSpace(meta)
	if len(trace) == 0 {
		if len(t) == 0 || bytes.Equal(t, []byte("null")) {
			return nil, nil
		}
		s := string(meta)
		return &s, nil
	}
	m := map[string]json.RawMessage{}
	if len(t) > 0 && !bytes.Equal(t, []byte("null")) {
		if err := json.Unmarshal(meta, &m); err != nil {
			return nil, fmt.Errorf("metadata: %v", err)
		}
	}
	for k, v := range trace {
		if _, ok := m[k]; !ok {
			b, _ := json.Marshal(v)
			m[k] = b
		}
	}
	b, err := json.Marshal(m)
	if err != nil {
		return nil, err
	}
	s := string(b)
	return &s, nil
}

// TraceContext extracts the W3C trace context stored in an event's metadata
// into ctx, so that a handler's span joins the trace that appended it.
func TraceContext(ctx context.Context, metadata json.RawMessage) context.Context {
	if len(metadata) == 0 || !bytes.Contains(metadata, []byte("traceparent")) {
		return ctx
	}
	var m map[string]any
	if json.Unmarshal(metadata, &m) != nil {
		return ctx
	}
	carrier := propagation.MapCarrier{}
	for _, k := range []string{"traceparent", "tracestate"} {
		if v, ok := m[k].(string); ok {
			carrier[k] = v
		}
	}
	return propagation.TraceContext{}.Extract(ctx, carrier)
}
