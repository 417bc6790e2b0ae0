package actors

import (
	"context"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/internal/startstop"
)

// publisherService is the runtime's Publisher actor as a service of kumi's
// lifecycle contract: Start spawns it, Stop stops it and waits for it.
type publisherService struct {
	life   startstop.Lifecycle
	system *actor.ActorSystem
	props  *actor.Props
	logger *slog.Logger
	pid    *actor.PID // set by Start
}

// Start spawns the publisher.
func (p *publisherService) Start(ctx context.Context) error {
	return p.life.Start(ctx, func(context.Context) error {
		p.pid = p.system.Root.Spawn(p.props)
		return nil
	})
}

// Stop stops the publisher and waits until it has terminated, at most
// until ctx ends (then it stops it without waiting, and logs it).
func (p *publisherService) Stop(ctx context.Context) error {
	return p.life.Stop(ctx, func(ctx context.Context) error {
		if ctx.Err() != nil {
			p.system.Root.Stop(p.pid) // no time left to wait
			return ctx.Err()
		}
		err := stopActor(ctx, p.system, p.pid)
		if err != nil {
			p.logger.Warn("kumi: runtime stop: the publisher did not stop in time; left running", "err", err)
		}
		return err
	})
}
