package leasestore

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Changes returns a channel that receives when another worker of the
// subscription claims, releases, hands over, joins or leaves: run a Pass
// then. It has capacity one, so a burst of notifications is one wake-up,
// and it also fires after the listener (re)connects, since notifications
// may have been missed meanwhile. It never fires with Config.NoListen, and
// a lost notification only delays: polling every Heartbeat remains the
// correctness fallback.
func (s *Store) Changes() <-chan struct{} { return s.changes }

func (s *Store) signal() {
	select {
	case s.changes <- struct{}{}:
	default:
	}
}

// notify queues a notification in tx; PostgreSQL delivers it on commit.
// The payload is "events:worker", so the listener can skip its own.
func (s *Store) notify(ctx context.Context, tx pgx.Tx, events string) error {
	if _, err := tx.Exec(ctx, s.st.get("notify"), s.channel, events+":"+s.cfg.Worker); err != nil {
		return fmt.Errorf("leasestore: notify: %w", err)
	}
	return nil
}

// listen holds a dedicated LISTEN connection until ctx ends, reconnecting
// with backoff.
func (s *Store) listen(ctx context.Context) {
	defer s.wg.Done()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		connected, err := s.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		if connected {
			backoff = 50 * time.Millisecond
		}
		s.log.Warn("lease notification listener lost; reconnecting", "err", err, "after", backoff)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// listenOnce listens until the connection fails; connected reports
// whether it got as far as listening.
func (s *Store) listenOnce(ctx context.Context) (connected bool, err error) {
	conn, err := pgx.ConnectConfig(ctx, s.pool.Config().ConnConfig.Copy())
	if err != nil {
		return false, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(cctx)
		cancel()
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{s.channel}.Sanitize()); err != nil {
		return false, err
	}
	s.signal() // anything sent while we were not listening is lost: look now
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		s.received.Add(1)
		if _, from, _ := strings.Cut(n.Payload, ":"); from != s.cfg.Worker {
			s.signal()
		}
	}
}
