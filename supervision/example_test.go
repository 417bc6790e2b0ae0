package supervision_test

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/supervision"
)

func ExampleClassify() {
	for _, err := range []error{
		&pgconn.PgError{Code: "40P01"}, // deadlock detected
		fmt.Errorf("read: %w", io.ErrUnexpectedEOF),
		fmt.Errorf("checkpoint: %w", eventsource.ErrFenceLost),
		&kumierr.ConfigError{Field: "actors.GroupOptions.Buckets", Value: 0, Reason: "must be at least 1"},
		errors.New("who knows"),
	} {
		fmt.Println(supervision.Classify(err))
	}
	// Output:
	// transient
	// transient
	// fence_lost
	// config
	// unknown
}

func ExampleBackoff() {
	b := supervision.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Jitter: supervision.NoJitter}
	var delays []time.Duration
	for attempt := 1; attempt <= 6; attempt++ {
		delays = append(delays, b.Next(attempt))
	}
	fmt.Println(delays)
	b.Jitter = supervision.FullJitter
	d := b.Next(3)
	fmt.Println(d >= 0 && d <= b.Ceiling(3))
	// Output:
	// [100ms 200ms 400ms 800ms 1s 1s]
	// true
}

// An observer for actors.RuntimeOptions.Supervision: decisions logged at
// Debug, and the ones that stop a child counted.
func ExampleObservers() {
	stops := 0
	obs := supervision.Observers(
		supervision.LogObserver(nil), // Debug logs, for operators
		supervision.ObserverFunc(func(d supervision.Decision) {
			if d.Directive == actor.StopDirective {
				stops++
			}
		}),
	)
	obs.Observe(supervision.Decision{Class: supervision.FenceLost, Directive: actor.StopDirective})
	obs.Observe(supervision.Decision{Class: supervision.Transient, Directive: actor.RestartDirective, Attempt: 1})
	fmt.Println("stops:", stops)
	// Output:
	// stops: 1
}
