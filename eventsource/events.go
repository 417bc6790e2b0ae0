package eventsource

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/google/uuid"
)

// ExpectedVersion is an append's optimistic-concurrency condition. Versions
// are 0-based: a stream's first event has version 0.
type ExpectedVersion int64

const (
	// Any appends whatever the stream's version.
	Any ExpectedVersion = -2
	// NoStream appends only to a stream that has no events.
	NoStream ExpectedVersion = -1
	// StreamExists appends only to a stream that has at least one event.
	StreamExists ExpectedVersion = -3
)

// Exact appends only when the stream's current version is v.
func Exact(v int64) ExpectedVersion { return ExpectedVersion(v) }

// String names the mode, or the exact version.
func (e ExpectedVersion) String() string {
	switch e {
	case Any:
		return "any"
	case NoStream:
		return "no stream"
	case StreamExists:
		return "stream exists"
	}
	return fmt.Sprintf("version %d", int64(e))
}

// EventData is an event to append.
type EventData struct {
	// ID identifies the event; zero means a fresh UUIDv7.
	ID uuid.UUID
	// Type is the event type, e.g. "Deposited". Required.
	Type string
	// Data is the JSON payload. Required and must be valid JSON.
	Data json.RawMessage
	// Metadata is optional JSON object metadata. When the append's context
	// carries an OpenTelemetry span, its W3C trace context is added under
	// "traceparent" (and "tracestate") unless already present.
	Metadata json.RawMessage
}

// RecordedEvent is an event as stored.
type RecordedEvent struct {
	// ID is the event's id, unique in the store.
	ID uuid.UUID
	// Stream is the stream's full name, Category its category.
	Stream   string
	Category string
	// Version is the event's 0-based version within its stream.
	Version int64
	// Position is the event's global position: commit-safe order across
	// the whole store, assigned by the sequencer shortly after commit.
	Position int64
	// Hash is the consumer-group hash of the stream's cardinal id.
	Hash int64
	// Type is the event type given at append.
	Type string
	// Data is the JSON payload, as PostgreSQL's jsonb renders it (keys
	// sorted by length then bytes, insignificant white space normalised).
	Data json.RawMessage
	// Metadata is the JSON object metadata, nil if none.
	Metadata json.RawMessage
	// RecordedAt is the time of the appending transaction.
	RecordedAt time.Time
	// Err is nil for an event read in full. For an event the store holds
	// but PostgreSQL fails to give back (see [UnreadableEventError]) it is
	// a *UnreadableEventError: Data and Metadata are then nil, the other
	// fields are set, and the read returns the events around it as usual.
	Err error
}

// Bucket returns the event's consumer-group bucket in a group of n.
func (e *RecordedEvent) Bucket(n int) int { return BucketOfHash(e.Hash, n) }

// recordedEventOverhead is what a RecordedEvent costs in memory besides its
// strings and payloads.
const recordedEventOverhead = int64(unsafe.Sizeof(RecordedEvent{}))

// Size returns about how many bytes the event holds in memory: its data,
// metadata, names and the struct itself. Byte-bounded reads and queues
// count events by it.
func (e *RecordedEvent) Size() int64 {
	return recordedEventOverhead + int64(len(e.Data)+len(e.Metadata)+len(e.Stream)+len(e.Category)+len(e.Type))
}

// AppendResult describes a successful append.
type AppendResult struct {
	// IDs of the appended events, in order.
	IDs []uuid.UUID
	// FirstVersion and LastVersion are the versions given to the first and
	// last events; LastVersion is the stream's new version.
	FirstVersion, LastVersion int64
}

// WrongExpectedVersionError reports an append whose expected version did
// not hold. Nothing was written.
type WrongExpectedVersionError struct {
	// Stream is the stream appended to, Expected the append's condition.
	Stream   string
	Expected ExpectedVersion
	// Actual is the stream's current version, -1 if it has no events.
	Actual int64
}

// Error describes the conflict.
func (e *WrongExpectedVersionError) Error() string {
	return fmt.Sprintf("kumi: append to %q expected %s, but the stream is at version %d", e.Stream, e.Expected, e.Actual)
}

// Unwrap returns [ErrWrongExpectedVersion].
func (e *WrongExpectedVersionError) Unwrap() error { return ErrWrongExpectedVersion }

// Sentinel errors; the typed errors that carry detail unwrap to them.
var (
	// ErrWrongExpectedVersion is wrapped by [*WrongExpectedVersionError].
	ErrWrongExpectedVersion = errors.New("kumi: wrong expected version")
	// ErrDuplicateEventID reports an append carrying an event id the store
	// already has. Appends with a known id are refused, never silently
	// ignored: nothing of the batch is written.
	ErrDuplicateEventID = errors.New("kumi: duplicate event id")
	// ErrInvalidEvent is wrapped by [*EventError].
	ErrInvalidEvent = errors.New("kumi: invalid event")
	// ErrInvalidBucket reports a consumer-group bucket outside [0, size).
	ErrInvalidBucket = errors.New("kumi: invalid consumer-group bucket")
	// ErrUnreadableEvent is wrapped by [*UnreadableEventError].
	ErrUnreadableEvent = errors.New("kumi: unreadable event")
)

// UnreadableEventError marks an event that the store holds but cannot give
// back: reading its payload fails with an error that one row can cause on
// its own (out of memory building its text, a data exception, data
// corruption), whatever put it there (SQL written directly, an older
// version without today's checks). Reads return such an event with this
// error in [RecordedEvent.Err] in its place, so that one bad row never
// stops a read of the rows around it; a subscription dead-letters it.
type UnreadableEventError struct {
	EventID  uuid.UUID
	Stream   string
	Version  int64
	Position int64
	// Err is PostgreSQL's error for the event's row.
	Err error
}

// Error names the event and PostgreSQL's error.
func (e *UnreadableEventError) Error() string {
	return fmt.Sprintf("kumi: event %s (stream %q, version %d, position %d) cannot be read: %v",
		e.EventID, e.Stream, e.Version, e.Position, e.Err)
}

// Unwrap returns [ErrUnreadableEvent] and PostgreSQL's error.
func (e *UnreadableEventError) Unwrap() []error { return []error{ErrUnreadableEvent, e.Err} }

// EventError reports an event the store refuses. Nothing of the batch is
// written.
type EventError struct {
	// Index is the event's position in the batch, or -1 when PostgreSQL
	// refused a value and did not say which event held it.
	Index int
	// Reason says what is wrong with the event.
	Reason string
	// Err is the cause when there is one: a [*NameError] for an invalid
	// event type.
	Err error
}

// Error describes the refused event.
func (e *EventError) Error() string {
	return fmt.Sprintf("kumi: invalid event %d: %s", e.Index, e.Reason)
}

// Unwrap returns [ErrInvalidEvent] and the cause, if any.
func (e *EventError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrInvalidEvent}
	}
	return []error{ErrInvalidEvent, e.Err}
}
