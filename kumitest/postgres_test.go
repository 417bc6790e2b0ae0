package kumitest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumitest"
)

// projection is an exactly-once handler's table of balances in the event
// store's database.
type projection struct {
	store *eventsource.Store
	table string
}

func newProjection(t *testing.T) *projection {
	t.Helper()
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pgtest.NewPool(t, 8), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, actors.Migrate(context.Background(), store))
	p := &projection{store: store, table: pgx.Identifier{schema, "balances"}.Sanitize()}
	_, err = store.Pool().Exec(context.Background(), `CREATE TABLE `+p.table+` (account text PRIMARY KEY, total bigint NOT NULL)`)
	require.NoError(t, err)
	return p
}

// handle applies a deposit with the checkpoint, fenced.
func (p *projection) handle(ctx context.Context, d *actors.Delivery, e deposited) error {
	return actors.CommitWithCheckpoint(ctx, p.store, d, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+p.table+` AS b VALUES ($1, $2)
			ON CONFLICT (account) DO UPDATE SET total = b.total + excluded.total`, d.Event.Stream, e.Amount)
		return err
	})
}

// naive applies a deposit in a transaction of its own: not exactly-once.
func (p *projection) naive(ctx context.Context, d *actors.Delivery, e deposited) error {
	_, err := p.store.Pool().Exec(ctx, `INSERT INTO `+p.table+` AS b VALUES ($1, $2)
		ON CONFLICT (account) DO UPDATE SET total = b.total + excluded.total`, d.Event.Stream, e.Amount)
	return err
}

// world empties the table: a fresh world for each pass.
func (p *projection) world(t *testing.T, handler func(context.Context, *actors.Delivery, deposited) error) func() kumitest.World {
	return func() kumitest.World {
		_, err := p.store.Pool().Exec(context.Background(), `TRUNCATE `+p.table)
		require.NoError(t, err)
		return kumitest.World{Handler: actors.Typed(handler), Effects: func() any {
			rows, err := p.store.Pool().Query(context.Background(), `SELECT account, total FROM `+p.table)
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
		}}
	}
}

func TestWithAStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CommitWithCheckpointIsExactlyOnceUnderEverySchedule", func(t *testing.T) {
		t.Parallel()
		p := newProjection(t)
		k, err := kumitest.New(kumitest.Options{Store: p.store,
			Group: actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 2, CheckpointEvery: 4}})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		require.NoError(t, k.Check(ctx, deposits(24, 3), p.world(t, p.handle), kumitest.CheckOptions{Seeds: 2}))
	})

	t.Run("TheSameProjectionWithoutTheCheckpointIsCaught", func(t *testing.T) {
		t.Parallel()
		p := newProjection(t)
		k, err := kumitest.New(kumitest.Options{Store: p.store,
			Group: actors.GroupOptions{Subscription: "balances", Category: "account", Buckets: 2}})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		err = k.Check(ctx, deposits(12, 3), p.world(t, p.naive), kumitest.CheckOptions{Seeds: 1})
		var fe *kumitest.FaultError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, kumitest.CrashTail, fe.Fault)
	})

	t.Run("DeadLettersAreWrittenToTheStore", func(t *testing.T) {
		t.Parallel()
		p := newProjection(t)
		k, err := kumitest.New(kumitest.Options{Store: p.store,
			Group: actors.GroupOptions{Subscription: "dead", Category: "account", Buckets: 2,
				Handler: actors.Typed(func(ctx context.Context, d *actors.Delivery, e deposited) error {
					if e.Amount < 0 {
						return actors.Permanent(fmt.Errorf("a deposit of %d", e.Amount))
					}
					return p.handle(ctx, d, e)
				})}})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		res, err := k.Run(ctx, kumitest.Event{Stream: "account-1", Type: "Deposited", Data: deposited{Amount: 2}},
			kumitest.Event{Stream: "account-1", Type: "Deposited", Data: deposited{Amount: -1}})
		require.NoError(t, err)
		require.Len(t, res.DeadLetters(), 1)
		stored, err := p.store.DeadLetters(ctx, "dead-kit1", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Len(t, stored, 1)
		require.Equal(t, res.Outcomes[1].Event.ID, stored[0].EventID)
		require.Equal(t, "a deposit of -1", stored[0].Reason)
		require.Equal(t, 1, stored[0].Attempts)
	})

	// The kit's leases are real: after the bucket moves, the fence of the
	// earlier owner is refused.
	t.Run("AnEarlierOwnersFenceIsRefused", func(t *testing.T) {
		t.Parallel()
		p := newProjection(t)
		var mu sync.Mutex
		fences := map[int64]eventsource.Fence{}
		k, err := kumitest.New(kumitest.Options{Store: p.store,
			Group: actors.GroupOptions{Subscription: "fenced", Category: "account", Buckets: 1,
				Handler: actors.Typed(func(ctx context.Context, d *actors.Delivery, e deposited) error {
					mu.Lock()
					fences[d.Epoch] = d.Fence
					mu.Unlock()
					return p.handle(ctx, d, e)
				})}})
		require.NoError(t, err)
		t.Cleanup(k.Close)
		res, err := k.RunFault(ctx, kumitest.Handoff, 1, deposits(12, 2)...)
		require.NoError(t, err)
		require.Equal(t, 12, res.Acked())
		require.GreaterOrEqual(t, len(fences), 2, "the bucket moved")
		last := res.Deliveries[len(res.Deliveries)-1].Epoch
		for epoch, f := range fences {
			err := pgx.BeginFunc(ctx, p.store.Pool(), func(tx pgx.Tx) error { return f.Check(ctx, tx) })
			if epoch == last {
				require.NoError(t, err, "the owner's fence holds")
			} else {
				require.ErrorIs(t, err, eventsource.ErrFenceLost, "epoch %d's fence", epoch)
			}
		}
		// The pass ran as subscription "fenced-kit1": its checkpoint covers
		// every event.
		cp, err := p.store.Checkpoint(ctx, "fenced-kit1", 0)
		require.NoError(t, err)
		require.Equal(t, res.Outcomes[len(res.Outcomes)-1].Event.Position, cp)
	})
}
