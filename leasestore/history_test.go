package leasestore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/kumierr"
)

// record reads the whole ownership record of the bundle's subscription,
// oldest first, as "kind gen/bucket from->to" lines.
func (b *testBundle) record(t *testing.T, f OwnershipFilter) ([]OwnershipChange, []string) {
	t.Helper()
	f.Subscription = b.sub
	f.Limit = 1000
	cs, err := ReadOwnership(context.Background(), b.pool, b.schema, f)
	require.NoError(t, err)
	lines := make([]string, 0, len(cs))
	for i := len(cs) - 1; i >= 0; i-- {
		c := cs[i]
		lines = append(lines, fmt.Sprintf("%s %d/%d %s->%s", c.Kind, c.Generation, c.Bucket, c.From, c.To))
	}
	for i := range len(cs) / 2 {
		cs[i], cs[len(cs)-1-i] = cs[len(cs)-1-i], cs[i]
	}
	return cs, lines
}

// Every change of ownership is in the record, in order, with its time, its
// evidence and who made it — whichever path made it: a pass's claim, a
// handoff in two phases, a steal of a lapsed lease, an operator's request
// and fence, a graceful leave. Renewals write nothing.
func TestTheOwnershipRecordSaysWhoOwnedABucketAndWhy(t *testing.T) {
	t.Parallel()
	forEachKind(t, func(t *testing.T, kind Kind) {
		ctx := context.Background()
		b := setup(t)
		a := b.open(t, b.config(kind, 2, "a"))
		require.Len(t, pass(t, a).Owned, 2)
		for range 3 {
			pass(t, a) // renewals
		}
		_, lines := b.record(t, OwnershipFilter{Generation: -1})
		require.Equal(t, []string{"join -1/-1 ->a", "claim 0/0 ->a", "claim 0/1 ->a"}, lines, "renewals write nothing")

		c := b.open(t, b.config(kind, 2, "c"))
		res := pass(t, c)
		require.Len(t, res.Requested, 1)
		moved := res.Requested[0].Bucket
		require.Equal(t, []int{moved}, pass(t, a).HandOff)
		require.NoError(t, a.HandOver(ctx, moved))
		require.Len(t, pass(t, c).Claimed, 1)
		cs, lines := b.record(t, OwnershipFilter{Generation: 0, Bucket: moved})
		require.Equal(t, []string{"join -1/-1 ->a", fmt.Sprintf("claim 0/%d ->a", moved), "join -1/-1 ->c",
			fmt.Sprintf("request 0/%d a->c", moved), fmt.Sprintf("release 0/%d a->", moved),
			fmt.Sprintf("handoff 0/%d a->c", moved)}, lines, "one bucket's story, with the pool's joins")
		require.Equal(t, "handing over to c", cs[4].Evidence)
		require.Contains(t, cs[5].Evidence, "c had claimed it at ")
		require.EqualValues(t, 2, cs[5].Epoch)
		for i := 1; i < len(cs); i++ {
			require.Greater(t, cs[i].ID, cs[i-1].ID)
			require.False(t, cs[i].At.Before(cs[i-1].At), "the database's clock, in order")
		}
		require.NotEmpty(t, cs[0].Role, "the login role that made it")

		// a dies: its worker row and leases lapse, and c takes its bucket.
		require.NoError(t, a.Stop(ctx))
		b.lapse(t, "a")
		_, err := b.pool.Exec(ctx, "UPDATE "+b.table("lease_buckets")+
			" SET expires_at = now() - interval '1 second' WHERE subscription = $1 AND owner = 'a'", b.sub)
		require.NoError(t, err)
		require.Len(t, pass(t, c).Claimed, 1)
		cs, _ = b.record(t, OwnershipFilter{Generation: 0, Bucket: 1 - moved})
		steal := cs[len(cs)-1]
		require.Equal(t, "steal", steal.Kind)
		require.Equal(t, "a", steal.From)
		require.Equal(t, "c", steal.To)
		require.Contains(t, steal.Evidence, "a's lease had expired at ")
		require.Contains(t, steal.Evidence, "a's worker row had expired at ")

		// An operator, named by its application: a fence, then a request
		// nobody can take (c is the only live worker) is refused and
		// writes nothing.
		cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
		require.NoError(t, err)
		cfg.ConnConfig.RuntimeParams["application_name"] = "kumi checkpoints"
		op, err := pgxpool.NewWithConfig(ctx, cfg)
		require.NoError(t, err)
		defer op.Close()
		require.NoError(t, pgx.BeginFunc(ctx, op, func(tx pgx.Tx) error {
			_, err := FenceOut(ctx, tx, b.schema, b.sub, moved, true)
			return err
		}))
		_, err = RequestHandoff(ctx, op, b.schema, b.sub, moved, "")
		require.Error(t, err)
		cs, _ = b.record(t, OwnershipFilter{Generation: 0, Bucket: moved})
		fence := cs[len(cs)-1]
		require.Equal(t, "reclaim", fence.Kind, "the owner stays, its epoch grows")
		require.Equal(t, "epoch 2 -> 3", fence.Evidence)
		require.Equal(t, "kumi checkpoints", fence.Application)

		// c leaves gracefully: both buckets released, then its row goes.
		require.NoError(t, c.Leave(ctx))
		_, lines = b.record(t, OwnershipFilter{Generation: -1})
		tail := lines[len(lines)-3:]
		require.ElementsMatch(t, []string{"release 0/0 c->", "release 0/1 c->", "leave -1/-1 c->"}, tail, "%v", lines)
		require.Equal(t, "leave -1/-1 c->", tail[2])
	})
}

// The record keeps what its retention says: older changes are pruned as
// new ones are written, and a bad retention or filter is refused by name.
func TestTheOwnershipRecordIsBoundedByItsRetention(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	keep, err := OwnershipRetention(ctx, b.pool, b.schema)
	require.NoError(t, err)
	require.Equal(t, 7*24*time.Hour, keep, "the default")

	a := b.open(t, b.config(KindRow, 4, "a"))
	require.Len(t, pass(t, a).Owned, 4)
	cs, _ := b.record(t, OwnershipFilter{Generation: -1})
	require.Len(t, cs, 5)

	require.NoError(t, SetOwnershipRetention(ctx, b.pool, b.schema, 0))
	keep, err = OwnershipRetention(ctx, b.pool, b.schema)
	require.NoError(t, err)
	require.Zero(t, keep)
	require.NoError(t, a.Leave(ctx)) // five changes; the older ones go
	cs, lines := b.record(t, OwnershipFilter{Generation: -1})
	require.Len(t, cs, 5, "%v", lines)
	for _, c := range cs {
		require.Contains(t, []string{"release", "leave"}, c.Kind, "%v", lines)
	}
	since := cs[0].At
	cs, _ = b.record(t, OwnershipFilter{Generation: -1, Since: since.Add(time.Microsecond)})
	require.Less(t, len(cs), 5, "Since bounds the times")

	var cfg *kumierr.ConfigError
	require.ErrorAs(t, SetOwnershipRetention(ctx, b.pool, b.schema, -time.Second), &cfg)
	require.True(t, strings.Contains(cfg.Field, "keep"), cfg.Field)
	_, err = ReadOwnership(ctx, b.pool, b.schema, OwnershipFilter{Subscription: b.sub, Limit: -1})
	require.ErrorAs(t, err, &cfg)
	require.Equal(t, "leasestore.OwnershipFilter.Limit", cfg.Field)
}
