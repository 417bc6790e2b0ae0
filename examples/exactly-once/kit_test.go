package main

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/examples/internal/exampletest"
	"github.com/kumi-run/kumi/kumitest"
)

// kitStore is a migrated store on a database of its own, with the
// program's table.
func kitStore(t *testing.T) *eventsource.Store {
	t.Helper()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, exampletest.NewDatabase(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
	require.NoError(t, err)
	require.NoError(t, actors.Migrate(ctx, store))
	_, err = pool.Exec(ctx, createTable)
	require.NoError(t, err)
	return store
}

// balances reads the projection.
func balances(t *testing.T, store *eventsource.Store) map[string]int64 {
	rows, err := store.Pool().Query(context.Background(), `SELECT account, total FROM account_balances`)
	require.NoError(t, err)
	out := map[string]int64{}
	for rows.Next() {
		var a string
		var n int64
		require.NoError(t, rows.Scan(&a, &n))
		out[a] = n
	}
	require.NoError(t, rows.Err())
	return out
}

func deposits() []kumitest.Event {
	var evs []kumitest.Event
	for i := range 30 {
		evs = append(evs, kumitest.Event{Stream: fmt.Sprintf("account-%d", i%4), Type: "Deposited", Data: Deposited{Amount: i%5 + 1}})
	}
	return evs
}

// The projection, run by the kit against a real store with real leases:
// each deposit applied once, then the same under every fault schedule.
func TestTheProjectionWithTheKit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := kitStore(t)
	k, err := kumitest.New(kumitest.Options{Store: store, Group: actors.GroupOptions{
		Subscription: "balances-projection", Category: "account", Buckets: 4, CheckpointEvery: 5,
	}})
	require.NoError(t, err)
	t.Cleanup(k.Close)

	// applied counts, per pass of the kit, the deposits the handler applied
	// and saw commit: passes[0] is the clean pass.
	var mu sync.Mutex
	var passes []int
	handler := projection(store, func(*actors.Delivery, Deposited, int64) { mu.Lock(); passes[len(passes)-1]++; mu.Unlock() })
	world := func() kumitest.World {
		_, err := store.Pool().Exec(ctx, `TRUNCATE account_balances`)
		require.NoError(t, err)
		mu.Lock()
		passes = append(passes, 0)
		mu.Unlock()
		return kumitest.World{Handler: handler.Props(), Effects: func() any { return balances(t, store) }}
	}
	require.NoError(t, k.Check(ctx, deposits(), world, kumitest.CheckOptions{Seeds: 2}))
	want := map[string]int64{}
	for _, e := range deposits() {
		want[e.Stream] += int64(e.Data.(Deposited).Amount)
	}
	require.Equal(t, want, balances(t, store), "the last pass's projection is exact")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, passes, 1+2*5, "the clean pass, then 2 seeds of the 5 schedules that run without batches")
	require.Equal(t, 30, passes[0], "the clean pass applied every deposit once")
	for i, n := range passes {
		// A timed-out attempt (timeout-retry cancels up to 8 of a pass) can
		// commit as its context is cancelled and see an error: its retry
		// finds it committed (ErrAlreadyCommitted) and applies nothing, so
		// the handler does not see that deposit commit, though it did.
		require.GreaterOrEqual(t, n, 30-8, "pass %d applied every deposit, but for timed-out attempts that committed unseen", i)
	}
}

// The same update without CommitWithCheckpoint, deliberately not
// exactly-once: a crash applies the tail again, and the kit catches it.
func TestAProjectionWithoutTheCheckpointIsCaught(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := kitStore(t)
	k, err := kumitest.New(kumitest.Options{Store: store, Group: actors.GroupOptions{
		Subscription: "balances-naive", Category: "account", Buckets: 4,
	}})
	require.NoError(t, err)
	t.Cleanup(k.Close)
	world := func() kumitest.World {
		_, err := store.Pool().Exec(ctx, `TRUNCATE account_balances`)
		require.NoError(t, err)
		return kumitest.World{
			Handler: actors.Typed(func(ctx context.Context, d *actors.Delivery, e Deposited) error {
				_, err := store.Pool().Exec(ctx, applyDeposit, d.Event.Stream, e.Amount) // its own transaction
				return err
			}),
			Effects: func() any { return balances(t, store) },
		}
	}
	err = k.Check(ctx, deposits(), world, kumitest.CheckOptions{Seeds: 1})
	var fe *kumitest.FaultError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, kumitest.CrashTail, fe.Fault)
	t.Log(err)
}
