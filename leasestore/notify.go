package leasestore

import (
	"context"
	"fmt"
	"strings"

	"github.com/kumi-run/kumi/eventsource"
)

// Changes returns a channel that receives when another worker of the
// subscription claims, releases, hands over, joins or leaves: run a Pass
// then. It has capacity one, so a burst of notifications is one wake-up,
// and it also fires once the store's channel is listened on and after
// every reconnection, since notifications may have been missed meanwhile.
// It never fires with Config.NoListen, and a lost notification only
// delays: polling every Heartbeat remains the correctness fallback.
func (s *Store) Changes() <-chan struct{} { return s.changes }

// notify queues a notification in tx; PostgreSQL delivers it on commit.
// The payload is "events:worker", so the listener can skip its own; a
// resize's transition is "resize:<state>:worker" (docs/design/resize.md), and
// no other event is sent with it.
func (s *Store) notify(ctx context.Context, tx txConn, events string) error {
	if q, ok := tx.(noteQueuer); ok && q.queueNote(s.st.get("notify"), s.channel, events+":"+s.cfg.Worker) {
		return nil // sent with the COMMIT (see runPipelined)
	}
	if _, err := tx.Exec(ctx, s.st.get("notify"), s.channel, events+":"+s.cfg.Worker); err != nil {
		return fmt.Errorf("leasestore: notify: %w", err)
	}
	return nil
}

// listen feeds [Store.Changes] from cfg.Notifier, or from a notifier of
// the store's own (started here, stopped by [Store.Stop]) when there is
// none. Either way it is eventsource's notifier: its reconnections with
// backoff and jitter, its pings of a silent connection, and its wake-up
// after every (re)connection.
func (s *Store) listen(ctx context.Context) error {
	n := s.cfg.Notifier
	if n == nil {
		own, err := eventsource.NewNotifier(s.pool, eventsource.NotifierOptions{
			Channels: []string{s.channel}, PollInterval: -1, Logger: s.log,
		})
		if err != nil {
			return fmt.Errorf("leasestore: listener: %w", err)
		}
		if err := own.Start(ctx); err != nil {
			return fmt.Errorf("leasestore: listener: %w", err)
		}
		n, s.ownNotifier = own, own
	}
	l, err := n.ListenFiltered(s.channel, func(payload string) bool {
		s.received.Add(1)
		payload, _ = strings.CutPrefix(payload, "resize:") // resize:<state>:worker
		_, from, _ := strings.Cut(payload, ":")
		return from != s.cfg.Worker
	})
	if err != nil {
		_ = s.stopListening(context.WithoutCancel(ctx))
		return fmt.Errorf("leasestore: listener: %w", err)
	}
	s.listener, s.changes = l, l.C()
	return nil
}

// stopListening closes the listener and stops the store's own notifier,
// waiting for it at most until ctx ends.
func (s *Store) stopListening(ctx context.Context) error {
	if s.listener != nil {
		s.listener.Close()
	}
	if s.ownNotifier != nil {
		if err := s.ownNotifier.Stop(ctx); err != nil {
			s.log.Warn("lease notification listener did not stop in time", "err", err)
			return err
		}
	}
	return nil
}
