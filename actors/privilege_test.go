package actors

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// A worker runs under the least-privilege role of docs/operations.md: no
// CREATE anywhere, only the table grants listed there, once the owner has
// migrated and built the consumer-group index.
func TestWorkerRunsUnderTheLeastPrivilegeRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	pool := pgtest.Pool(t)
	require.NoError(t, Migrate(ctx, store))
	require.NoError(t, store.EnsureConsumerGroupIndex(ctx, 2))

	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "kumi_worker_" + hex.EncodeToString(b[:])
	q, r := pgx.Identifier{schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + r + " LOGIN",
		"GRANT USAGE ON SCHEMA " + q + " TO " + r,
		"GRANT SELECT ON " + q + ".schema_migrations TO " + r,
		fmt.Sprintf("GRANT SELECT, INSERT ON %[1]s.events TO %[2]s", q, r),
		fmt.Sprintf("GRANT SELECT, INSERT, UPDATE ON %[1]s.streams, %[1]s.appends, %[1]s.checkpoints, %[1]s.dead_letters, %[1]s.lease_buckets TO %[2]s", q, r),
		"GRANT SELECT, UPDATE ON " + q + ".sequencer TO " + r,
		"GRANT SELECT ON SEQUENCE " + q + ".appends_seq_seq TO " + r,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + q + ".lease_workers TO " + r,
		// Resizes (docs/design/resize.md): the subscriptions' generations, and the
		// retired generation's lease rows a completion deletes.
		"GRANT SELECT, INSERT, UPDATE ON " + q + ".subscriptions, " + q + ".generations TO " + r,
		"GRANT DELETE ON " + q + ".lease_buckets TO " + r,
		// Parking (docs/design/parking.md): a reader parks, releases and
		// drops parked streams' rows.
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + q + ".parked_streams TO " + r,
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+r)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+r)
	})

	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.MaxConns = role, 8
	wpool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(wpool.Close)
	var n int
	err = wpool.QueryRow(ctx, "SELECT count(*) FROM pg_roles WHERE rolname = current_user AND NOT rolsuper").Scan(&n)
	require.NoError(t, err)
	require.Equal(t, 1, n, "the worker connects as the unprivileged role")

	rec := newRecorder()
	w := &testWorker{name: "w", sys: quietSystem(), pool: wpool}
	ws, err := eventsource.New(wpool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, ws, RuntimeOptions{Logger: testLogger()})
	require.NoError(t, err)
	o := groupOpts("least", 2, rec, "w")
	o.Worker = "w"
	// A group that parks, with a poison event in acct-1 (version 2).
	o.Handler, _ = parkingHandler("actor", rec, ws, "acct-1")
	o.OnDeadLetter = ParkStream
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	seed(t, ws, "acct", 3, 30) // appends as the worker role too
	// acct-1's versions 2 to 9 wait, parked.
	pgtest.Eventually(t, waitLong, func() bool { return rec.distinct() == 22 }, "handled (got %d)", observed(rec.distinct))
	pgtest.Eventually(t, waitLong, func() bool {
		p, err := ws.ParkedStreams(ctx, "least", eventsource.ParkedFilter{})
		return err == nil && len(p) == 1 && p[0].Stream == "acct-1"
	}, "acct-1 parked by the worker role")
	_, err = wpool.Exec(ctx, "CREATE TABLE "+q+".nope (x int)")
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "permission denied"), "the role really cannot create: %v", err)
}
