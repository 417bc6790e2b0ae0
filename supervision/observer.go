package supervision

import (
	"context"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"
)

// Decision is what a supervisor strategy decided about one failure. Logs, metrics
// and traces hook in through an [Observer].
type Decision struct {
	// Strategy is "one_for_one" or "all_for_one".
	Strategy string
	// Supervisor is the supervising actor's PID, or "" for a guardian.
	Supervisor string
	// Child is the failed child's PID.
	Child string
	// Class is the failure's class, Directive what the strategy did.
	Class     Class
	Directive actor.Directive
	// Targets are the children the directive applied to: the failed child,
	// or under all-for-one all its siblings too. Empty for Escalate.
	Targets []string
	// Attempt counts the child's failures within the retry window,
	// this one included (0 unless the decider chose Restart).
	Attempt int
	// Delay is how long the restart waits (Restart only).
	Delay time.Duration
	// Exhausted reports that the retry budget ran out: Directive is then
	// the strategy's exhaustion directive instead of Restart.
	Exhausted bool
	// Reason is the failure, as an error (a string or other panic value becomes an error with its text).
	Reason error
	// Time is when the decision was made.
	Time time.Time
}

// Observer receives every [Decision], before the decision is carried out,
// on the goroutine of the supervisor that made it (for a guardian, of the
// failed actor). A strategy shared by several supervisors calls it
// concurrently. It must be quick, must not block and must be safe for
// concurrent use.
type Observer interface {
	Observe(Decision)
}

// ObserverFunc adapts a function to [Observer].
type ObserverFunc func(Decision)

// Observe calls f(d).
func (f ObserverFunc) Observe(d Decision) { f(d) }

// Observers returns an [Observer] that passes each decision to every
// non-nil observer in obs, in order.
func Observers(obs ...Observer) Observer {
	var list multiObserver
	for _, o := range obs {
		if o != nil {
			list = append(list, o)
		}
	}
	return list
}

type multiObserver []Observer

func (m multiObserver) Observe(d Decision) {
	for _, o := range m {
		o.Observe(d)
	}
}

// LogObserver returns an [Observer] that logs each decision at Debug — so
// kumi is quiet by default — as "kumi supervision decision" with the
// decision's fields as attributes. A nil logger means [slog.Default].
// It is the default observer of kumi's strategies.
func LogObserver(logger *slog.Logger) Observer {
	return ObserverFunc(func(d Decision) {
		l := logger
		if l == nil {
			l = slog.Default()
		}
		if !l.Enabled(context.Background(), slog.LevelDebug) {
			return
		}
		attrs := []slog.Attr{
			slog.String("strategy", d.Strategy),
			slog.String("child", d.Child),
			slog.String("class", d.Class.String()),
			slog.String("directive", d.Directive.String()),
			slog.Int("attempt", d.Attempt),
			slog.Duration("delay", d.Delay),
			slog.Bool("exhausted", d.Exhausted),
			slog.Any("reason", d.Reason),
		}
		if d.Supervisor != "" {
			attrs = append(attrs, slog.String("supervisor", d.Supervisor))
		}
		if len(d.Targets) > 1 {
			attrs = append(attrs, slog.Int("targets", len(d.Targets)))
		}
		l.LogAttrs(context.Background(), slog.LevelDebug, "kumi supervision decision", attrs...)
	})
}
