package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// readOnlyStore is f's schema seen through a role with USAGE on it and
// SELECT on its tables, nothing else: docs/operations.md's read-only role
// for the console and `kumi status`.
func (f *fixture) readOnlyStore(t *testing.T) *eventsource.Store {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t)
	var b [4]byte
	_, _ = rand.Read(b[:])
	role := "kumi_ro_" + hex.EncodeToString(b[:])
	q, r := pgx.Identifier{f.schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"CREATE ROLE " + r + " LOGIN",
		"GRANT USAGE ON SCHEMA " + q + " TO " + r,
		"GRANT SELECT ON ALL TABLES IN SCHEMA " + q + " TO " + r,
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
	cfg.ConnConfig.User, cfg.MaxConns = role, 4
	ro, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(ro.Close)
	store, err := eventsource.New(ro, eventsource.Config{Schema: f.schema})
	require.NoError(t, err)
	return store
}

// The read-only role reads every page, and with actions on the console
// cannot change anything: each action fails on the database's refusal.
func TestTheConsoleRunsUnderAReadOnlyRole(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	d := f.hostileLetter(t, "orders")
	a := f.lease(t, "orders", "worker-a", 2)
	f.join(t, "orders", "worker-b", 2) // live: someone could take a relinquished bucket
	_, err := f.store.SaveCheckpoint(ctx, "orders", 0, 5, a.Fence(0, a.Held()[0].Epoch))
	require.NoError(t, err)
	ro := f.readOnlyStore(t)

	c, err := New(Options{Store: ro, AllowActions: true, Categories: map[string]string{"orders": "acct"},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	for _, path := range []string{"/", "/api/overview", "/s/orders", "/api/s/orders", "/s/orders/letters",
		"/s/orders/letters/" + d.EventID.String()} {
		r := get(t, srv, path)
		require.Equal(t, http.StatusOK, r.status, "%s: %s", path, r.body)
	}
	require.Contains(t, get(t, srv, "/api/s/orders").body, `"owner":"worker-a"`)

	for _, path := range []string{
		"/api/s/orders/buckets/0/reset?force=1&position=1",
		"/api/s/orders/buckets/1/relinquish",
		"/api/s/orders/letters/" + d.EventID.String() + "/discard",
	} {
		r := post(t, srv, c, path)
		require.Equal(t, http.StatusInternalServerError, r.status, "%s: %s", path, r.body)
		require.Contains(t, r.body, "permission denied", path)
	}
	p, err := f.store.Checkpoint(ctx, "orders", 0)
	require.NoError(t, err)
	require.EqualValues(t, 5, p)
	_, err = f.store.DeadLetter(ctx, "orders", d.EventID)
	require.NoError(t, err)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Empty(t, res.HandOff, fmt.Sprintf("no handoff was asked: %+v", res))
}
