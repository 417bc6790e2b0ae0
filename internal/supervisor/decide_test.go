package supervisor

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/supervision"
)

type marker struct{ permanent bool }

func (m marker) Error() string        { return "marked" }
func (m marker) PermanentError() bool { return m.permanent }

func pg(code string) error { return &pgconn.PgError{Code: code} }

func TestDefaultDecider(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		reason any
		class  supervision.Class
		dir    actor.Directive
	}{
		{pg("40001"), supervision.Transient, actor.RestartDirective},
		{eventsource.ErrFenceLost, supervision.FenceLost, actor.StopDirective},
		{&kumierr.ConfigError{Field: "X", Reason: "bad"}, supervision.Config, actor.EscalateDirective},
		{marker{permanent: true}, supervision.Permanent, actor.StopDirective},
		{"a string panic", supervision.Unknown, actor.RestartDirective},
		{42, supervision.Unknown, actor.RestartDirective},
	} {
		if c, d := DefaultDecider(tc.reason); c != tc.class || d != tc.dir {
			t.Errorf("DefaultDecider(%v) = %v, %v; want %v, %v", tc.reason, c, d, tc.class, tc.dir)
		}
	}
}

func TestReasonError(t *testing.T) {
	t.Parallel()
	err := errors.New("x")
	if ReasonError(nil) != nil || ReasonError(err) != err || ReasonError("s").Error() != "s" || ReasonError(7).Error() != "7" {
		t.Error("ReasonError")
	}
}
