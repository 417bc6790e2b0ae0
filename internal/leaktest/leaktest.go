// Package leaktest holds kumi's one list of goroutines that goleak may
// ignore, for every package's TestMain (directly, or through pgtest.Main).
package leaktest

import "go.uber.org/goleak"

// Ignore returns the goleak options for goroutines that end by themselves
// shortly after the tests, so are no leak.
func Ignore() []goleak.Option {
	return []goleak.Option{
		// pgx's pool health checker stops asynchronously after Close.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		// protoactor's dead-letter throttle waits one throttle interval (1 s
		// by default) after the first dead letter of an interval — a
		// message to an actor that has just stopped is enough — then ends.
		// Its function may be inlined into NewDeadLetter, hence both names.
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewThrottle.func1.1"),
	}
}

// VerifyTestMain runs the tests and fails the run on leaked goroutines,
// ignoring those of [Ignore].
func VerifyTestMain(m goleak.TestingM, extra ...goleak.Option) {
	goleak.VerifyTestMain(m, append(Ignore(), extra...)...)
}
