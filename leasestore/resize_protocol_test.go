package leasestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestProtocolOneWorkerIsFencedOut(t *testing.T) {
	t.Parallel()
	forEachKind(t, protocolOneWorkerIsFencedOut)
}

func protocolOneWorkerIsFencedOut(t *testing.T, kind Kind) {
	ctx := context.Background()
	b := setupResize(t, 4)
	a := b.open(t, b.config(kind, 2, "a"))
	require.NoError(t, a.EnsureBuckets(ctx))
	p1 := newProtocolOne(b.pool, b.schema, b.sub, "older", 2, 30*time.Second, nil)
	held, err := p1.pass(ctx)
	require.NoError(t, err, "never resized: a protocol-1 worker works")
	require.Len(t, held, 2)
	snap, err := a.Snapshot(ctx)
	require.NoError(t, err)
	for _, w := range snap.Workers {
		require.Equal(t, map[string]int{"a": 2, "older": 1}[w.Worker], w.Protocol, w.Worker)
	}

	_, err = RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: 4, EvictOldWorkers: true})
	require.NoError(t, err)
	isKU001 := func(err error) {
		t.Helper()
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "KU001", pgErr.Code)
		require.Contains(t, pgErr.Message, "predates resizes")
	}
	isKU001(p1.heartbeat(ctx))
	_, err = p1.pass(ctx)
	isKU001(err)
	res := pass(t, a) // protocol 2 goes through
	require.Equal(t, ResizeSealing, res.Resize.State)

	// Another protocol-1 worker, never live before: refused as well.
	isKU001(newProtocolOne(b.pool, b.schema, b.sub, "newcomer", 2, 30*time.Second, nil).heartbeat(ctx))
	_, err = CancelResize(ctx, b.pool, b.schema, b.sub)
	require.NoError(t, err)
	require.NoError(t, p1.heartbeat(ctx), "cancelled before any switch, never resized: accepted again")

	// Resized: refused for good.
	_, err = b.pool.Exec(ctx, "UPDATE "+b.table("subscriptions")+" SET generation = 1")
	require.NoError(t, err)
	isKU001(p1.heartbeat(ctx))
}

// A request and a protocol-1 heartbeat at once: exactly one of the two
// wins, never both (the heartbeat's trigger locks the subscription's row
// whatever its state; the request locks it before reading the workers).
func TestRequestAndProtocolOneHeartbeatRace(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupResize(t, 4)
	a := b.open(t, b.config(KindRow, 2, "a"))
	require.NoError(t, a.EnsureBuckets(ctx))
	p1 := newProtocolOne(b.pool, b.schema, b.sub, "older", 2, 30*time.Second, nil)
	expire := func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT set_config('kumi.protocol', '2', true)"); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "UPDATE "+b.table("lease_workers")+
			" SET expires_at = now() - interval '1 hour', heartbeat_at = now() - interval '1 hour' WHERE worker = 'older'")
		return err
	}
	wins := map[string]int{}
	for range 100 {
		require.NoError(t, pgx.BeginFunc(ctx, b.pool, expire))
		var reqErr, hbErr error
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			_, reqErr = RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: 4})
		}()
		go func() { defer wg.Done(); hbErr = p1.heartbeat(ctx) }()
		wg.Wait()
		switch {
		case reqErr == nil && hbErr == nil:
			t.Fatal("both the request and the protocol-1 heartbeat went through")
		case reqErr == nil:
			var pgErr *pgconn.PgError
			require.ErrorAs(t, hbErr, &pgErr)
			require.Equal(t, "KU001", pgErr.Code)
			wins["request"]++
			_, err := CancelResize(ctx, b.pool, b.schema, b.sub)
			require.NoError(t, err)
		default:
			require.ErrorIs(t, reqErr, ErrOldWorkers)
			require.NoError(t, hbErr)
			wins["heartbeat"]++
		}
	}
	t.Logf("wins: %v", wins)
}

// Requests, cancels, proposals, drains and passes of several workers at
// once never deadlock (40P01): the subscriptions row first, lease rows
// after, and a pass never waits for the subscriptions row.
func TestResizeLocksNeverDeadlock(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) { resizeLocksNeverDeadlock(t, kind) })
}

func resizeLocksNeverDeadlock(t *testing.T, kind Kind) {
	ctx := context.Background()
	b := setupResize(t, 6, 4)
	var stores []*Store
	for i := range 6 {
		stores = append(stores, b.open(t, b.config(kind, 4, fmt.Sprint("w", i))))
	}
	settle(t, stores, 4)
	// They run for 3 s, then on until each kind of transition has
	// succeeded at least once (a run of fixed length could see none on a
	// loaded machine), and stop before any assertion can fail the test.
	const run = 3 * time.Second
	start := time.Now()
	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	var mu sync.Mutex
	done := map[string]int{}
	count := func(what string, err error) {
		if err == nil {
			mu.Lock()
			done[what]++
			mu.Unlock()
		}
	}
	report := func(err error) {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "40P01" {
			select {
			case errs <- err:
			default:
			}
		}
	}
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rnd := rand.New(rand.NewPCG(uint64(i), 7))
			for !stopped() {
				_, err := s.Pass(ctx)
				report(err)
				for _, l := range s.Held() {
					if !l.Ready || l.Generation != b.resizeGeneration(ctx) {
						continue
					}
					bound, err := s.ProposeCut(ctx, l.Slot, l.Epoch, 0)
					report(err)
					count("propose", err)
					if bound.Decided && rnd.IntN(2) == 0 {
						err := s.Drain(ctx, l.Slot, l.Epoch, bound.Limit)
						report(err)
						count("drain", err)
					}
				}
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rnd := rand.New(rand.NewPCG(1, 2))
		for !stopped() {
			r, err := ReadResize(ctx, b.pool, b.schema, b.sub)
			report(err)
			if r.State == ResizeSteady {
				_, err = RequestResize(ctx, b.pool, b.schema, ResizeRequest{Subscription: b.sub, Buckets: 10 - r.Buckets})
				count("request", err)
			} else if rnd.IntN(8) == 0 {
				_, err = CancelResize(ctx, b.pool, b.schema, b.sub)
				count("cancel", err)
			}
			report(err)
		}
	}()
	whats := []string{"request", "cancel", "propose", "drain"}
	pgtest.WaitFor(run+2*time.Minute, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for _, what := range whats {
			if done[what] == 0 {
				return false
			}
		}
		return time.Since(start) >= run
	})
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("deadlock: %v", err)
	}
	t.Logf("done: %v", done)
	for _, what := range whats {
		require.Positive(t, done[what], "no %s succeeded: the test exercised nothing (%v)", what, done)
	}
}

// resizeGeneration is the serving generation, -1 when it cannot tell.
