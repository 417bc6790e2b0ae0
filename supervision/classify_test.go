package supervision

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/kumierr"
)

type marker struct{ config, permanent, transient bool }

func (m marker) Error() string        { return "marked" }
func (m marker) ConfigError() bool    { return m.config }
func (m marker) PermanentError() bool { return m.permanent }
func (m marker) TransientError() bool { return m.transient }

func pg(code string) error { return &pgconn.PgError{Code: code} }

func TestClassify(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want Class
	}{
		{"Nil", nil, Unknown},
		{"Plain", errors.New("boom"), Unknown},
		{"FenceLost", eventsource.ErrFenceLost, FenceLost},
		{"FenceLostWrapped", fmt.Errorf("checkpoint: %w", eventsource.ErrFenceLost), FenceLost},
		{"FenceLostBeatsTransient", errors.Join(pg("40001"), eventsource.ErrFenceLost), FenceLost},
		{"ConfigError", &kumierr.ConfigError{Field: "X", Reason: "bad"}, Config},
		{"ConfigMarker", fmt.Errorf("wrapped: %w", marker{config: true}), Config},
		{"PermanentMarker", marker{permanent: true}, Permanent},
		{"QueueOverflow", fmt.Errorf("bucket 3: %w", &overflow.OverflowError{Capacity: 64}), Permanent},
		{"TransientMarker", marker{transient: true}, Transient},
		{"MarkerSaysNo", marker{}, Unknown},
		{"ConnectionException", pg("08006"), Transient},
		{"SerializationFailure", pg("40001"), Transient},
		{"Deadlock", fmt.Errorf("append: %w", pg("40P01")), Transient},
		{"LockNotAvailable", pg("55P03"), Transient},
		{"AdminShutdown", pg("57P01"), Transient},
		{"CrashShutdown", pg("57P02"), Transient},
		{"CannotConnectNow", pg("57P03"), Transient},
		{"TooManyConnections", pg("53300"), Transient},
		{"OutOfMemory", pg("53200"), Transient},
		{"QueryCanceled", pg("57014"), Unknown},
		{"UniqueViolation", pg("23505"), Unknown},
		{"InvalidPassword", pg("28P01"), Config},
		{"NoSuchDatabase", pg("3D000"), Config},
		{"NoSuchSchema", pg("3F000"), Config},
		{"NoSuchTable", pg("42P01"), Config},
		{"InsufficientPrivilege", pg("42501"), Config},
		{"SyntaxError", pg("42601"), Unknown},
		{"DeadlineExceeded", fmt.Errorf("read bucket: %w", context.DeadlineExceeded), Transient},
		{"Canceled", context.Canceled, Unknown},
		{"EOF", io.EOF, Transient},
		{"UnexpectedEOF", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), Transient},
		{"NetOpError", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, Transient},
		{"DNSError", &net.DNSError{Err: "timeout", Name: "db", IsTimeout: true}, Transient},
		{"ConnReset", fmt.Errorf("write: %w", syscall.ECONNRESET), Transient},
		{"BrokenPipe", syscall.EPIPE, Transient},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestNames(t *testing.T) {
	t.Parallel()
	if FenceLost.String() != "fence_lost" || Class(99).String() != "Class(99)" ||
		EqualJitter.String() != "equal" || Jitter(9).String() != "Jitter(9)" {
		t.Error("String")
	}
}
