package observability

import (
	"context"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
)

// ProtoactorLoggerFactory returns a logger factory for
// actor.WithLoggerFactory that routes protoactor-go's logging through base
// (nil means slog.Default()), tagged lib=protoactor and actor_system=<id>.
//
// protoactor-go logs every dead letter, every actor recovery and its own
// start at Info; those records are demoted to Debug, so with a handler at
// the usual Info level they disappear, and at Debug they are still there.
// Warn and Error records pass unchanged.
//
//	system := actor.NewActorSystem(actor.WithLoggerFactory(
//		observability.ProtoactorLoggerFactory(logger)))
func ProtoactorLoggerFactory(base *slog.Logger) func(*actor.ActorSystem) *slog.Logger {
	return func(system *actor.ActorSystem) *slog.Logger {
		b := base
		if b == nil {
			b = slog.Default()
		}
		l := slog.New(demote(b.Handler(), slog.LevelInfo, slog.LevelDebug)).With(slog.String("lib", "protoactor"))
		if system != nil {
			l = l.With(slog.String("actor_system", system.ID))
		}
		return l
	}
}

// demote wraps h so that records at or below level from are logged
// at level to instead (records above from are unchanged). It is how
// ProtoactorLoggerFactory quiets a chatty library without losing its
// warnings.
func demote(h slog.Handler, from, to slog.Level) slog.Handler {
	return demoted{h: h, from: from, to: to}
}

type demoted struct {
	h        slog.Handler
	from, to slog.Level
}

func (d demoted) level(l slog.Level) slog.Level {
	if l <= d.from && l > d.to {
		return d.to
	}
	return l
}

func (d demoted) Enabled(ctx context.Context, l slog.Level) bool {
	return d.h.Enabled(ctx, d.level(l))
}

func (d demoted) Handle(ctx context.Context, r slog.Record) error {
	if nl := d.level(r.Level); nl != r.Level {
		r = r.Clone()
		r.Level = nl
	}
	return d.h.Handle(ctx, r)
}

func (d demoted) WithAttrs(as []slog.Attr) slog.Handler {
	return demoted{h: d.h.WithAttrs(as), from: d.from, to: d.to}
}

func (d demoted) WithGroup(name string) slog.Handler {
	return demoted{h: d.h.WithGroup(name), from: d.from, to: d.to}
}
