package eventsource_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// TestStoreThroughATransactionPooler: every kind of statement the store
// runs — migrations, single- and multi-event appends (also in the caller's
// transaction), sequencing, reads, bucket reads, checkpoints and dead
// letters — through a real PgBouncer 1.18 in transaction mode, with the
// exec mode docs/operations.md gives (pgtest.BouncerExecMode) and with
// describe_exec. The modes that guess parameter types from Go types, exec
// and simple_protocol, cannot encode a multi-event append's []uuid.UUID:
// if that ever changes, docs/operations.md should say so.
func TestStoreThroughATransactionPooler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := pgtest.NewBouncer(t, pgtest.LocalServer(t), pgtest.PoolTransaction)
	base := strings.Replace(bouncer.URL, "&default_query_exec_mode="+pgtest.BouncerExecMode, "", 1)
	store := func(t *testing.T, mode string) *eventsource.Store {
		pool, err := pgxpool.New(ctx, base+"&default_query_exec_mode="+mode)
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(t)})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		return s
	}

	for _, mode := range []string{pgtest.BouncerExecMode, "describe_exec"} {
		t.Run("Mode_"+mode+"_RunsEverything", func(t *testing.T) {
			s := store(t, mode)
			mustAppend(t, s, "acct-1", ev("Opened", `{}`))
			many := mustAppend(t, s, "acct-2", ev("Opened", `{}`), ev("Deposited", `{"n":1}`), ev("Deposited", `{"n":2}`))
			tx, err := s.Pool().Begin(ctx)
			require.NoError(t, err)
			_, err = s.AppendTx(ctx, tx, "acct-3", eventsource.NoStream, []eventsource.EventData{ev("Opened", `{}`), ev("Closed", `{}`)})
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			sequenceAll(t, s)

			all, err := s.ReadAll(ctx, 0, 100)
			require.NoError(t, err)
			require.Len(t, all, 6)
			for i, e := range all {
				require.EqualValues(t, i+1, e.Position)
			}
			stream, err := s.ReadStream(ctx, "acct-2", 0, 10)
			require.NoError(t, err)
			require.Len(t, stream, 3)
			// Uncontended here; docs/operations.md says to build these over a
			// direct connection (the build takes a session advisory lock).
			require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 2))
			var read int
			for m := 0; m < 2; m++ {
				events, err := s.ReadBucket(ctx, "acct", m, 2, 0, 100)
				require.NoError(t, err)
				read += len(events)
			}
			require.Equal(t, 6, read)

			cp, err := s.SaveCheckpoint(ctx, "sub", 0, 4, nil)
			require.NoError(t, err)
			require.EqualValues(t, 4, cp)
			_, err = s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", Bucket: 0, EventID: many.IDs[1],
				Reason: "poison", Attempts: 5})
			require.NoError(t, err)
			letters, err := s.DeadLetters(ctx, "sub", eventsource.DeadLetterFilter{})
			require.NoError(t, err)
			require.Len(t, letters, 1)
		})
	}

	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run("Mode_"+mode+"_CannotAppendSeveralEvents", func(t *testing.T) {
			s := store(t, mode)
			mustAppend(t, s, "acct-1", ev("Opened", `{}`))
			_, err := s.Append(ctx, "acct-2", eventsource.Any, []eventsource.EventData{ev("Opened", `{}`), ev("Closed", `{}`)})
			require.ErrorContains(t, err, "unable to encode []uuid.UUID")
		})
	}
}

// TestNotifierThroughATransactionPoolerRunsOnItsPoll: the notifier's
// LISTEN through PgBouncer in transaction mode succeeds and hears nothing
// (the pooler lent a server connection for that one statement); a reader
// waiting on it is still woken for new events, by the safety poll.
func TestNotifierThroughATransactionPoolerRunsOnItsPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bouncer := pgtest.NewBouncer(t, pgtest.LocalServer(t), pgtest.PoolTransaction)
	s, err := eventsource.New(pgtest.PoolOn(t, bouncer.URL, 4), eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))
	n, err := s.NewNotifier(eventsource.NotifierOptions{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	l, err := n.Listen(s.NotifyChannel())
	require.NoError(t, err)
	require.NoError(t, n.Start(ctx))
	defer func() { require.NoError(t, n.Stop(ctx)) }()
	pgtest.Eventually(t, 30*time.Second, func() bool { return n.Stats().Connected }, "the notifier connects")
	drain := func() {
		select {
		case <-l.C():
		default:
		}
	}
	drain() // the tick every connection gives

	mustAppend(t, s, "acct-1", ev("Opened", `{}`))
	sequenceAll(t, s) // NOTIFYs the head
	select {
	case <-l.C():
	case <-time.After(30 * time.Second):
		t.Fatal("no tick within 30 s: the safety poll did not wake the reader")
	}
	st := n.Stats()
	require.Zero(t, st.Notifications, "LISTEN through a transaction pooler hears nothing")
	require.Positive(t, st.PollTicks, "the tick came from the safety poll")
	require.EqualValues(t, 1, n.Latest(s.NotifyChannel()))
}
