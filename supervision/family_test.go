package supervision_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/console"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/dburl"
	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/supervision"
)

// errOf drops a constructor's value and keeps its error.
func errOf[T any](_ T, err error) error { return err }

// TestEveryConfigErrorClassifiesAsConfig holds one invalid field of every
// kumi package, as its package returns it where it can be provoked without
// a database — each a *kumierr.ConfigError — and one error of every other
// type that reports a setting the database or the server refuses: each
// carries the [supervision.ConfigMarker], so Classify sees Config, bare and
// wrapped, and the default decider escalates it instead of restarting into
// the same failure. A new configuration error type belongs in this table.
func TestEveryConfigErrorClassifiesAsConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ string // the concrete type, as %T prints it
		err error
	}{
		{"*kumierr.ConfigError", supervision.Backoff{Initial: -1}.Validate()},
		{"*kumierr.ConfigError", errOf(eventsource.New(nil, eventsource.Config{}))},
		{"*kumierr.ConfigError", leasestore.Config{Subscription: "orders", Buckets: 4}.Validate()},
		{"*kumierr.ConfigError", actors.GroupOptions{}.WithDefaults().Validate()},
		{"*kumierr.ConfigError", errOf(console.New(console.Options{}))},
		{"*kumierr.ConfigError", errOf(overflow.New(overflow.Config{Capacity: -1}))},
		{"*leasestore.SessionMismatchError", &leasestore.SessionMismatchError{Mismatch: leasestore.MismatchDatabase, Session: "a", Pool: "b"}},
		{"*leasestore.SessionPoolerError", &leasestore.SessionPoolerError{Evidence: "two backends"}},
		{"*kumierr.ConfigError", migrate.CheckSchema("leasestore schema", "")},
		{"*dburl.Error", errOf(dburl.Parse(""))},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			t.Parallel()
			if got := fmt.Sprintf("%T", tc.err); got != tc.typ {
				t.Fatalf("the error is a %s (%v), want a %s", got, tc.err, tc.typ)
			}
			var marker supervision.ConfigMarker
			if !errors.As(tc.err, &marker) || !marker.ConfigError() {
				t.Errorf("%s does not report ConfigError() true", tc.typ)
			}
			for _, err := range []error{tc.err, fmt.Errorf("start group: %w", tc.err)} {
				if got := supervision.Classify(err); got != supervision.Config {
					t.Errorf("Classify(%v) = %v, want %v", err, got, supervision.Config)
				}
			}
			if c, d := supervisor.DefaultDecider(tc.err); c != supervision.Config || d != supervisor.DirectiveFor(supervision.Config) {
				t.Errorf("DefaultDecider(%v) = %v, %v", tc.err, c, d)
			}
		})
	}
}
