package supervision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
)

// Class is what kind of failure an error reports, as far as supervision is
// concerned: whether restarting the failed actor can help.
type Class int

const (
	// Unknown failures are not recognised; they are restarted with backoff.
	Unknown Class = iota
	// Transient failures go away by themselves: a dropped connection, a
	// serialization failure or deadlock, a server shutting down or short of
	// resources, a timeout. Restart with backoff.
	Transient
	// FenceLost means the worker no longer holds what it works on
	// ([eventsource.ErrFenceLost]). Stop at once; never restart.
	FenceLost
	// Config means invalid configuration (see [ConfigMarker]): a restart
	// fails the same way. Escalate to whoever can report it.
	Config
	// Permanent failures will not go away (see [PermanentMarker]). Stop.
	Permanent
)

var classNames = [...]string{"unknown", "transient", "fence_lost", "config", "permanent"}

// String returns the class's name, e.g. "fence_lost", fit for a metric
// attribute.
func (c Class) String() string {
	if c < 0 || int(c) >= len(classNames) {
		return fmt.Sprintf("Class(%d)", int(c))
	}
	return classNames[c]
}

// ConfigMarker is implemented by errors that report invalid configuration
// and return true. Any package can mark its errors without importing this
// one.
//
// It is the one mark of kumi's configuration errors. An invalid field or
// argument is a [*kumierr.ConfigError], whichever package refused it and
// whether it was refused at construction or once the database was reached
// (a read pool that is not a standby of the primary, a resize whose index
// is missing, a schema newer than the binary; its Err tells them apart).
// The other marked errors report KindSession's connection refused by what
// it reaches, with what was found (leasestore.SessionMismatchError,
// leasestore.SessionPoolerError), and the internal dburl.Error, a
// connection string that does not parse. A test classifies one of each.
type ConfigMarker interface {
	ConfigError() bool
}

// PermanentMarker is implemented by errors that a restart cannot cure and
// return true, such as overflow.OverflowError.
type PermanentMarker interface {
	PermanentError() bool
}

// TransientMarker is implemented by errors that go away by themselves and
// return true: a way to mark as [Transient] what [Classify] would not
// recognise.
type TransientMarker interface {
	TransientError() bool
}

// Classify returns the class of err, looking through wrapped errors. In
// order: nil is [Unknown]; anything wrapping [eventsource.ErrFenceLost] is
// [FenceLost]; then the markers ([ConfigMarker], [PermanentMarker],
// [TransientMarker]); then PostgreSQL errors by SQLSTATE (see below); then
// pgconn's timeouts, connect errors and errors it reports safe to retry,
// [context.DeadlineExceeded], [net.Error], [io.EOF],
// [io.ErrUnexpectedEOF] and connection resets, refusals and broken pipes
// are [Transient]. Everything else is [Unknown].
//
// SQLSTATEs: class 08 (connection exception), 40001 (serialization
// failure), 40P01 (deadlock), 55P03 (lock not available), 57P01-57P03
// (admin shutdown, crash shutdown, cannot connect now) and class 53
// (insufficient resources) are [Transient]; class 28 (invalid
// authorization), 3D000 (no such database), 3F000 (no such schema), 42P01
// (no such table: not migrated) and 42501 (insufficient privilege) are
// [Config]. Other codes are [Unknown].
func Classify(err error) Class {
	if err == nil {
		return Unknown
	}
	if errors.Is(err, eventsource.ErrFenceLost) {
		return FenceLost
	}
	if c, ok := classifyMarkers(err); ok {
		return c
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return classifySQLState(pgErr.Code)
	}
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	switch {
	case pgconn.Timeout(err), pgconn.SafeToRetry(err), errors.As(err, &connectErr),
		errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNABORTED), errors.Is(err, syscall.EPIPE):
		return Transient
	}
	return Unknown
}

func classifyMarkers(err error) (Class, bool) {
	var cm ConfigMarker
	if errors.As(err, &cm) && cm.ConfigError() {
		return Config, true
	}
	var pm PermanentMarker
	if errors.As(err, &pm) && pm.PermanentError() {
		return Permanent, true
	}
	var tm TransientMarker
	if errors.As(err, &tm) && tm.TransientError() {
		return Transient, true
	}
	return Unknown, false
}

func classifySQLState(code string) Class {
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"),
		code == "40001", code == "40P01", code == "55P03",
		code == "57P01", code == "57P02", code == "57P03":
		return Transient
	case strings.HasPrefix(code, "28"),
		code == "3D000", code == "3F000", code == "42P01", code == "42501":
		return Config
	}
	return Unknown
}
