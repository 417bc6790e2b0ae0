package actors

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// projection is a table of per-event counters written through
// CommitWithCheckpoint: applied > 1 is an effect committed twice.
type projection struct {
	store *eventsource.Store
	q     string
}

func newProjection(t *testing.T, store *eventsource.Store, schema string) *projection {
	q := pgx.Identifier{schema}.Sanitize()
	_, err := store.Pool().Exec(context.Background(), `CREATE TABLE `+q+`.proj (event_id uuid PRIMARY KEY, applied int NOT NULL)`)
	require.NoError(t, err)
	return &projection{store: store, q: q}
}

// apply is the handler's fn: an upsert counter.
func (p *projection) apply(d *Delivery) func(context.Context, pgx.Tx) error {
	return func(c context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(c, `INSERT INTO `+p.q+`.proj AS p (event_id, applied) VALUES ($1, 1)
			ON CONFLICT (event_id) DO UPDATE SET applied = p.applied + 1`, d.Event.ID)
		return err
	}
}

// counts returns the number of projected events and of events applied more
// than once.
func (p *projection) counts(t *testing.T) (n, over int) {
	err := p.store.Pool().QueryRow(context.Background(),
		`SELECT count(*), count(*) FILTER (WHERE applied <> 1) FROM `+p.q+`.proj`).Scan(&n, &over)
	require.NoError(t, err)
	return n, over
}

// answer is the handler's answer to CommitWithCheckpoint's result.
func answer(err error) any {
	switch {
	case err == nil, errors.Is(err, ErrAlreadyCommitted):
		return Ack{Committed: true}
	case errors.Is(err, eventsource.ErrFenceLost):
		return Ack{}
	default:
		return Retry{Reason: err.Error()}
	}
}

func TestExactlyOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// Attempt 0 of one event is still in its transaction when the reader
	// gives up on it (HandlerTimeout) and delivers attempt 1; attempt 0
	// then commits. Attempt 1, same owner and epoch, must not commit the
	// effect again: it finds the checkpoint covering the event and acks.
	t.Run("AnAttemptThatOutlivesTheHandlerTimeoutCommitsTheEffectOnce", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		proj := newProjection(t, store, schema)
		seed(t, store, "acct", 3, 12)
		evs, err := store.ReadStream(ctx, "acct-1", 1, 1)
		require.NoError(t, err)
		slow := evs[0].ID
		retried := make(chan struct{}) // attempt 1 of the slow event reached the handler
		var retriedOnce sync.Once
		var wg sync.WaitGroup
		t.Cleanup(wg.Wait)
		root := quietSystem().Root // answers from outside the handler's receive
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			d, ok := ctx.Message().(*Delivery)
			if !ok {
				return
			}
			if d.Event.ID == slow && d.Attempt > 0 {
				retriedOnce.Do(func() { close(retried) })
			}
			// Each attempt runs on its own, as a handler doing async work
			// (or a replaced handler) would: attempts can overlap.
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, cancel := context.WithTimeout(context.Background(), waitLong)
				defer cancel()
				err := CommitWithCheckpoint(c, store, d, func(c context.Context, tx pgx.Tx) error {
					if err := proj.apply(d)(c, tx); err != nil {
						return err
					}
					if d.Event.ID == slow && d.Attempt == 0 {
						<-retried // a slow transaction: it commits after the retry began
					}
					return nil
				})
				d.Respond(root, answer(err))
			}()
		})
		o := groupOpts("slowtx", 1, nil, "w")
		o.Handler, o.Retry, o.HandlerTimeout = handler, fastRetry(5), 200*time.Millisecond
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "slowtx", 0)
			return err == nil && cp == 12
		}, "the checkpoint reaches the last event")
		n, over := proj.counts(t)
		require.Equal(t, 12, n)
		require.Zero(t, over, "every effect committed once")
		dls, err := store.DeadLetters(ctx, "slowtx", eventsource.DeadLetterFilter{})
		require.NoError(t, err)
		require.Empty(t, dls, "the retried event is acked, not dead-lettered")
	})

	// A handler that panics after its commit is retried; the retry must
	// find the effect committed and not apply it again.
	t.Run("AHandlerThatPanicsAfterItsCommitIsNotAppliedAgain", func(t *testing.T) {
		t.Parallel()
		store, schema := newTestStore(t)
		proj := newProjection(t, store, schema)
		seed(t, store, "acct", 3, 12)
		var panics atomic.Int32
		var skipped atomic.Int32
		handler := actor.PropsFromFunc(func(ctx actor.Context) {
			d, ok := ctx.Message().(*Delivery)
			if !ok {
				return
			}
			err := CommitWithCheckpoint(d.Context, store, d, proj.apply(d))
			if errors.Is(err, ErrAlreadyCommitted) {
				skipped.Add(1)
			}
			if err == nil && d.Event.Version == 2 && d.Attempt < 2 {
				panics.Add(1)
				panic("after the commit")
			}
			ctx.Respond(answer(err))
		})
		o := groupOpts("panicaftercommit", 1, nil, "w")
		o.Handler, o.Retry = handler, fastRetry(5)
		startWorker(t, schema, "w", o)
		pgtest.Eventually(t, waitLong, func() bool {
			cp, err := store.Checkpoint(ctx, "panicaftercommit", 0)
			return err == nil && cp == 12
		}, "the checkpoint reaches the last event")
		n, over := proj.counts(t)
		require.Equal(t, 12, n)
		require.Zero(t, over, "every effect committed once")
		require.EqualValues(t, 3, panics.Load(), "one panic per stream's version 2")
		require.EqualValues(t, 3, skipped.Load(), "each retry found its event committed")
	})
}
