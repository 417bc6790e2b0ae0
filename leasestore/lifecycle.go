package leasestore

import (
	"context"
	"errors"

	"github.com/kumi-run/kumi/internal/startstop"
)

// ErrNotStarted is returned by the methods of a [Store] made by [New]
// until [Store.Start] has succeeded.
var ErrNotStarted = errors.New("leasestore: store not started (call Start, or make it with New)")

// Start joins the subscription's workers: KindSession first opens its
// dedicated connection and takes the session lock; then the store writes
// its membership row, so the other workers count it in their next fair
// share, and listens for their announcements (see [Store.Changes]). It
// follows kumi's lifecycle contract (docs/design/architecture.md, "Lifecycle"):
// ctx bounds the start only; a second Start does nothing; after Stop it
// returns [kumierr.ErrStopped]; a failed start undoes what it did, and may be tried
// again.
func (s *Store) Start(ctx context.Context) error { return s.life.Start(ctx, s.start) }

// Stop closes the store's listener (and its own LISTEN connection, when it
// has one rather than Config.Notifier, waiting for it at most until ctx
// ends) and its session connection; from then on its methods return
// [ErrClosed]. It releases no lease: call [Store.Leave] first for a
// graceful exit. For KindSession, closing the session is what tells the
// other workers that this one is gone. Stop is idempotent, safe before
// Start and from many goroutines.
func (s *Store) Stop(ctx context.Context) error {
	return s.life.Stop(ctx, func(ctx context.Context) error {
		s.closed.Store(true)
		err := s.stopListening(ctx)
		if s.session != nil {
			s.session.stop()
		}
		return err
	})
}

// running returns nil while the store runs, else why not.
func (s *Store) running() error {
	switch {
	case s.closed.Load():
		return ErrClosed
	case s.started.Load():
		return nil
	case s.life.State() == startstop.Stopped:
		return ErrClosed // stopped before it started
	default:
		return ErrNotStarted
	}
}
