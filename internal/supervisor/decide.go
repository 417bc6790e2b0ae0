package supervisor

import (
	"errors"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/supervision"
)

// ReasonError turns a failure reason — the value a failed actor panicked
// with — into an error: an error is returned as is, a string becomes an
// error with that text, and anything else is formatted with %v. A nil
// reason gives nil.
func ReasonError(reason any) error {
	switch r := reason.(type) {
	case nil:
		return nil
	case error:
		return r
	case string:
		return errors.New(r)
	default:
		return fmt.Errorf("%v", r)
	}
}

// Decider chooses what to do about a failed child: it classifies the
// failure reason and returns the class with a directive. The strategy then
// applies its retry budget and backoff to a Restart.
type Decider func(reason any) (supervision.Class, actor.Directive)

// DefaultDecider classifies reason with [supervision.Classify] and returns the
// directive [DirectiveFor] gives its class.
func DefaultDecider(reason any) (supervision.Class, actor.Directive) {
	c := supervision.Classify(ReasonError(reason))
	return c, DirectiveFor(c)
}

// DirectiveFor returns kumi's directive for a class: Stop for [supervision.FenceLost]
// and [supervision.Permanent], Escalate for [supervision.Config], Restart (with backoff) for
// [supervision.Transient] and [supervision.Unknown].
func DirectiveFor(c supervision.Class) actor.Directive {
	switch c {
	case supervision.FenceLost, supervision.Permanent:
		return actor.StopDirective
	case supervision.Config:
		return actor.EscalateDirective
	}
	return actor.RestartDirective
}
