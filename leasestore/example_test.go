package leasestore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

// exampleTB lets the examples borrow pgtest's helpers, which take a
// testing.TB; only the methods those helpers call are implemented.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func (e *exampleTB) Helper()                        {}
func (e *exampleTB) Fatal(args ...any)              { panic(fmt.Sprint(args...)) }
func (e *exampleTB) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }
func (e *exampleTB) Cleanup(f func())               { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) done() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}

// exampleDB returns the test database's pool and a fresh, migrated schema.
func exampleDB() (*pgxpool.Pool, string, func()) {
	tb := &exampleTB{}
	pool, schema := pgtest.Pool(tb), pgtest.NewSchema(tb)
	if err := leasestore.Migrate(context.Background(), pool, schema); err != nil {
		panic(err)
	}
	return pool, schema, tb.done
}

// A worker joins, claims its buckets, writes under a fence, and leaves.
func Example() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()

	store, err := leasestore.New(pool, leasestore.Config{
		Schema: schema, Subscription: "orders", Worker: "worker-1", Buckets: 4,
	})
	if err != nil {
		panic(err)
	}
	if err := store.Start(ctx); err != nil {
		panic(err)
	}
	defer store.Stop(ctx)

	res, err := store.Pass(ctx) // alone: its fair share is every bucket
	if err != nil {
		panic(err)
	}
	fmt.Println("live:", res.Live, "fair share:", res.FairShare)
	for _, l := range res.Claimed {
		fmt.Printf("bucket %d at epoch %d\n", l.Bucket, l.Epoch)
	}

	// A write of bucket 0's projection, guarded in its own transaction.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := store.Guard(ctx, tx, 0, res.Claimed[0].Epoch); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "SELECT 1") // the write
		return err
	})
	fmt.Println("guarded write:", err)
	fmt.Println("leave:", store.Leave(ctx))
	// Output:
	// live: 1 fair share: 4
	// bucket 0 at epoch 1
	// bucket 1 at epoch 1
	// bucket 2 at epoch 1
	// bucket 3 at epoch 1
	// guarded write: <nil>
	// leave: <nil>
}

// A second worker joins: it claims half of the first worker's buckets, the
// first drains them and hands them over, and the second activates them.
func ExampleStore_HandOver() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	open := func(worker string) *leasestore.Store {
		s, err := leasestore.New(pool, leasestore.Config{
			Schema: schema, Subscription: "orders", Worker: worker, Buckets: 4, LeaseOptions: leasestore.LeaseOptions{NoListen: true},
		})
		if err != nil {
			panic(err)
		}
		if err := s.Start(ctx); err != nil {
			panic(err)
		}
		return s
	}
	a := open("a")
	defer a.Stop(ctx)
	if _, err := a.Pass(ctx); err != nil {
		panic(err)
	}
	b := open("b")
	defer b.Stop(ctx)

	res, _ := b.Pass(ctx)
	fmt.Println("b requests:", res.Pending)
	res, _ = a.Pass(ctx)
	fmt.Println("a hands off:", res.HandOff)
	for _, bucket := range res.HandOff {
		// ...stop the bucket's reader and flush its checkpoint, then:
		if err := a.HandOver(ctx, bucket); err != nil {
			panic(err)
		}
	}
	res, _ = b.Pass(ctx)
	for _, t := range res.Takeovers {
		fmt.Printf("b took bucket %d at epoch %d (%s)\n", t.Bucket, t.Epoch, t.Evidence)
	}
	// Output:
	// b requests: [2 3]
	// a hands off: [2 3]
	// b took bucket 2 at epoch 2 (handoff)
	// b took bucket 3 at epoch 2 (handoff)
}

// A worker that paused past its lease finds its fenced write refused.
func ExampleStore_Fence() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	cfg := leasestore.Config{
		Schema: schema, Subscription: "orders", Buckets: 1, LeaseOptions: leasestore.LeaseOptions{NoListen: true, TTL: 3 * time.Second, Heartbeat: time.Second, Margin: 800 * time.Millisecond},
	}
	cfg.Worker = "zombie"
	zombie, _ := leasestore.New(pool, cfg)
	if err := zombie.Start(ctx); err != nil {
		panic(err)
	}
	defer zombie.Stop(ctx)
	granted, _ := zombie.Pass(ctx)
	epoch := granted.Owned[0].Epoch

	cfg.Worker = "successor"
	successor, _ := leasestore.New(pool, cfg)
	if err := successor.Start(ctx); err != nil {
		panic(err)
	}
	defer successor.Stop(ctx)
	// The zombie stops renewing; the successor takes over after expiry.
	pgtest.WaitFor(30*time.Second, func() bool {
		res, err := successor.Pass(ctx)
		return err == nil && len(res.Owned) == 1
	})

	fence := zombie.Fence(0, epoch)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		return fence.Check(ctx, tx) // the event store calls this before its checkpoint write
	})
	fmt.Println(errors.Is(err, eventsource.ErrFenceLost))
	var lost *leasestore.LostFenceError
	if errors.As(err, &lost) {
		fmt.Println("now owned by", lost.Owner, "at epoch", lost.FoundEpoch)
	}
	fmt.Println(zombie.EnsureHeld(0) != nil)
	// Output:
	// true
	// now owned by successor at epoch 2
	// true
}

func ExampleFairShare() {
	fmt.Println(leasestore.FairShare(1024, 32), leasestore.FairShare(10, 3), leasestore.FairShare(4, 0))
	// Output: 32 4 4
}

func ExampleConfig_WithDefaults() {
	c := leasestore.Config{LeaseOptions: leasestore.LeaseOptions{TTL: 15 * time.Second}}.WithDefaults()
	fmt.Println(c.TTL, c.Heartbeat, c.Margin)

	_, err := leasestore.New(nil, leasestore.Config{
		Schema: "kumi", Subscription: "orders", Buckets: 8, LeaseOptions: leasestore.LeaseOptions{TTL: 10 * time.Second, Heartbeat: 8 * time.Second},
	})
	var ce *kumierr.ConfigError
	if errors.As(err, &ce) {
		fmt.Println(ce.Field)
	}
	// Output:
	// 15s 3s 5s
	// leasestore.Config.Margin
}

func ExampleStore_EnsureBuckets() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	cfg := leasestore.Config{Schema: schema, Subscription: "orders", Buckets: 4, LeaseOptions: leasestore.LeaseOptions{NoListen: true}}
	four, _ := leasestore.New(pool, cfg)
	if err := four.Start(ctx); err != nil {
		panic(err)
	}
	defer four.Stop(ctx)
	fmt.Println(four.EnsureBuckets(ctx))

	// Once the subscription exists, the database's bucket count rules: a
	// worker configured with another one serves it (and logs so once).
	cfg.Buckets = 8
	eight, _ := leasestore.New(pool, cfg)
	if err := eight.Start(ctx); err != nil {
		panic(err)
	}
	defer eight.Stop(ctx)
	fmt.Println(eight.EnsureBuckets(ctx))
	res, _ := eight.Pass(ctx)
	fmt.Println("buckets", res.Resize.Buckets, "held", len(res.Owned))
	// Output:
	// <nil>
	// <nil>
	// buckets 4 held 2
}

func ExampleStore_Snapshot() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := leasestore.New(pool, leasestore.Config{
		Schema: schema, Subscription: "orders", Worker: "w1", Buckets: 2, LeaseOptions: leasestore.LeaseOptions{Kind: leasestore.KindSession},
	})
	if err := store.Start(ctx); err != nil {
		panic(err)
	}
	defer store.Stop(ctx)
	_, _ = store.Pass(ctx)
	snap, _ := store.Snapshot(ctx)
	for _, b := range snap.Buckets {
		fmt.Println(b.Bucket, b.Owner, b.Epoch, b.Held(snap.Now))
	}
	for _, m := range snap.Workers {
		fmt.Println(m.Worker, m.Kind, m.Live)
	}
	// Output:
	// 0 w1 1 true
	// 1 w1 1 true
	// w1 session true
}

// The shape of a coordinator's loop: a pass every heartbeat or when another
// worker changed something, readers started and stopped from the result.
// (Not run: it loops until ctx ends.)
func Example_coordinatorLoop() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, err := leasestore.New(pool, leasestore.Config{Schema: schema, Subscription: "orders", Buckets: 64})
	if err != nil {
		panic(err)
	}
	if err := store.Start(ctx); err != nil {
		panic(err)
	}
	defer store.Stop(ctx)
	defer func() { _ = store.Leave(context.Background()) }() // after stopping every reader

	tick := time.NewTicker(store.Config().Heartbeat)
	defer tick.Stop()
	for {
		res, err := store.Pass(ctx)
		if err == nil {
			for _, bucket := range res.Lost {
				fmt.Println("stop the reader of", bucket, "at once")
			}
			for _, l := range res.Claimed {
				fmt.Println("start a reader of", l.Bucket, "fenced by", store.Fence(l.Bucket, l.Epoch))
			}
			for _, bucket := range res.HandOff {
				fmt.Println("stop the reader of", bucket, "and flush its checkpoint, then")
				_ = store.HandOver(ctx, bucket)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-store.Changes():
		}
	}
}

// Three subscriptions' stores of one process share a batcher: once they
// hold their buckets, the passes they run together go to the database in
// one round trip, each pass its own transaction.
func ExamplePassBatcher() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	batcher, err := leasestore.NewPassBatcher(pool, 5*time.Millisecond)
	if err != nil {
		panic(err)
	}
	var stores []*leasestore.Store
	for _, sub := range []string{"orders", "invoices", "shipments"} {
		s, err := leasestore.New(pool, leasestore.Config{
			Schema: schema, Subscription: sub, Worker: "worker-1", Buckets: 2, Batcher: batcher,
		})
		if err != nil {
			panic(err)
		}
		if err := s.Start(ctx); err != nil {
			panic(err)
		}
		defer s.Stop(ctx)
		stores = append(stores, s)
	}
	var wg sync.WaitGroup
	owned := make([]int, len(stores))
	for range 2 { // the first passes claim, the next ones only renew
		for i, s := range stores {
			wg.Go(func() {
				res, err := s.Pass(ctx)
				if err != nil {
					panic(err)
				}
				owned[i] = len(res.Owned)
			})
		}
		wg.Wait()
	}
	fmt.Println("owned:", owned)
	// Output:
	// owned: [2 2 2]
}
