package leasestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// withDatabase returns the test URL pointed at database db, with a
// password in it that no error may repeat.
func withDatabase(t *testing.T, raw, db string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	if db != "" {
		u.Path = "/" + db
	}
	u.User = url.UserPassword(u.User.Username(), "s3cret-pw") // the test server trusts, so it is never checked
	return u.String()
}

// otherDatabase creates a second database on the test server, dropped when
// the test ends.
func otherDatabase(t *testing.T) string {
	t.Helper()
	var r [4]byte
	_, _ = rand.Read(r[:])
	name := "kumi_other_" + hex.EncodeToString(r[:])
	pool := pgtest.Pool(t)
	_, err := pool.Exec(context.Background(), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return name
}

// requireMismatch checks that err is a *SessionMismatchError of kind what
// that repeats neither the URL nor its password.
func requireMismatch(t *testing.T, err error, what SessionMismatch, sessionURL string) *SessionMismatchError {
	t.Helper()
	var mm *SessionMismatchError
	require.ErrorAs(t, err, &mm, "got %v", err)
	require.Equal(t, what, mm.Mismatch, "%v", err)
	require.NotContains(t, err.Error(), "s3cret-pw")
	if sessionURL != "" {
		require.NotContains(t, err.Error(), sessionURL)
	}
	return mm
}

func TestSessionReachesThePoolsServerAndDatabase(t *testing.T) {
	t.Parallel()

	t.Run("ASessionURLToAnotherDatabaseOfTheSameServerIsRefused", func(t *testing.T) {
		b := setup(t)
		other := otherDatabase(t)
		cfg := b.config(KindSession, 4, "a")
		cfg.SessionURL = withDatabase(t, pgtest.URL(t), other)
		_, err := startedStore(context.Background(), b.pool, cfg)
		mm := requireMismatch(t, err, MismatchDatabase, cfg.SessionURL)
		require.Contains(t, mm.Session, other)
		require.Contains(t, err.Error(), "SessionURL")

		// Nothing joined: a rival sees no worker, live or dead.
		bw := b.open(t, b.config(KindSession, 4, "b"))
		res := pass(t, bw)
		require.Equal(t, 1, res.Live)
		snap, err := bw.Snapshot(context.Background())
		require.NoError(t, err)
		require.Len(t, snap.Workers, 1)
	})

	t.Run("ASessionURLToAnotherServerIsRefused", func(t *testing.T) {
		ctx := context.Background()
		second, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 20})
		require.NoError(t, err)
		t.Cleanup(second.Stop)
		b := setup(t)
		cfg := b.config(KindSession, 4, "a")
		cfg.SessionURL = withDatabase(t, second.URL, "")
		_, err = startedStore(ctx, b.pool, cfg)
		requireMismatch(t, err, MismatchServer, cfg.SessionURL)
	})

	t.Run("TheSameDatabaseUnderAnotherURLIsAccepted", func(t *testing.T) {
		b := setup(t)
		cfg := b.config(KindSession, 4, "a")
		cfg.SessionURL = withDatabase(t, pgtest.URL(t), "")
		a := b.open(t, cfg)
		require.Len(t, pass(t, a).Owned, 4)
	})

	t.Run("AReopenedSessionIsCheckedAgain", func(t *testing.T) {
		// The session URL is read when the store is built, so a session
		// reopened after a drop lands where the first one did; what is
		// checked again is the reopened connection itself: point the saved
		// config at another database, as a DNS change or a failover would.
		b := setup(t)
		a := b.open(t, b.config(KindSession, 2, "a"))
		pass(t, a)
		other := otherDatabase(t)
		require.NoError(t, a.session.acquire(context.Background()))
		a.session.cfg.Database = other
		a.session.release()
		a.session.close() // the connection drops
		_, err := a.Pass(context.Background())
		requireMismatch(t, err, MismatchDatabase, "")
		require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)
	})

	t.Run("TheLeastPrivilegeRoleCanOpenASessionLease", func(t *testing.T) {
		ctx := context.Background()
		b := setup(t)
		role := leastPrivilegeRole(t, b)
		pool := rolePool(t, role)
		var sysid string
		require.NoError(t, pool.QueryRow(ctx, "SELECT system_identifier::text FROM pg_control_system()").Scan(&sysid),
			"PUBLIC may read the system identifier by default")
		a := openOn(t, pool, b.config(KindSession, 4, "a"))
		require.Len(t, pass(t, a).Owned, 4)

		other := otherDatabase(t)
		_, err := pgtest.Pool(t).Exec(ctx,
			"GRANT CONNECT ON DATABASE "+pgx.Identifier{other}.Sanitize()+" TO "+pgx.Identifier{role}.Sanitize())
		require.NoError(t, err)
		u, err := url.Parse(withDatabase(t, pgtest.URL(t), other))
		require.NoError(t, err)
		u.User = url.UserPassword(role, "s3cret-pw")
		elsewhere := b.config(KindSession, 4, "c")
		elsewhere.SessionURL = u.String()
		_, err = startedStore(ctx, pool, elsewhere)
		requireMismatch(t, err, MismatchDatabase, elsewhere.SessionURL)

		// As on a hosted service that revokes it: without the system
		// identifier the session still opens, and is still refused where
		// it must be. Only non-superusers (this test's role) are affected.
		_, err = pgtest.Pool(t).Exec(ctx, "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pgtest.Pool(t).Exec(context.Background(), "GRANT EXECUTE ON FUNCTION pg_control_system() TO PUBLIC")
		})
		_, err = pool.Exec(ctx, "SELECT pg_control_system()")
		require.ErrorContains(t, err, "permission denied")
		d := openOn(t, pool, b.config(KindSession, 4, "d"))
		pass(t, d)
		_, err = startedStore(ctx, pool, elsewhere)
		requireMismatch(t, err, MismatchDatabase, elsewhere.SessionURL)
	})
}

func TestCompareIdentitiesNamesTheFirstMismatch(t *testing.T) {
	t.Parallel()
	base := identity{database: "app", seesLock: true, system: "7"}
	with := func(f func(*identity)) identity { id := base; f(&id); return id }
	for _, c := range []struct {
		name       string
		sess, pool identity
		want       SessionMismatch
	}{
		{"same", base, base, ""},
		{"same, no system identifier", with(func(i *identity) { i.system = "" }), with(func(i *identity) { i.system = "" }), ""},
		{"session on a standby", with(func(i *identity) { i.standby = true }), base, MismatchStandby},
		{"pool on a standby", base, with(func(i *identity) { i.standby = true }), MismatchStandby},
		{"another cluster", with(func(i *identity) { i.system = "8" }), with(func(i *identity) { i.seesLock = false }), MismatchServer},
		{"another database", with(func(i *identity) { i.database = "other" }), with(func(i *identity) { i.seesLock = false }), MismatchDatabase},
		{"another server, identifier unreadable", with(func(i *identity) { i.system = "" }),
			with(func(i *identity) { i.system, i.seesLock = "", false }), MismatchLock},
	} {
		err := compareIdentities(c.sess, c.pool)
		if c.want == "" {
			require.NoError(t, err, c.name)
			continue
		}
		var mm *SessionMismatchError
		require.ErrorAs(t, err, &mm, c.name)
		require.Equal(t, c.want, mm.Mismatch, c.name)
	}
}

// leastPrivilegeRole creates a login role with only the grants
// docs/operations.md lists for workers on the lease tables.
func leastPrivilegeRole(t *testing.T, b *testBundle) string {
	t.Helper()
	return leastPrivilegeRoleOn(t, b, "lease_workers")
}

// leastPrivilegeRoleOn is leastPrivilegeRole with the workers' table named
// workers (its name before migration 0002 was lease_members).
func leastPrivilegeRoleOn(t *testing.T, b *testBundle, workers string) string {
	t.Helper()
	var r [4]byte
	_, _ = rand.Read(r[:])
	role := "kumi_lease_" + hex.EncodeToString(r[:])
	q, ro := pgx.Identifier{b.schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	pool := pgtest.Pool(t)
	for _, stmt := range []string{
		"CREATE ROLE " + ro + " LOGIN",
		"GRANT USAGE ON SCHEMA " + q + " TO " + ro,
		"GRANT SELECT ON " + q + ".schema_migrations TO " + ro,
		"GRANT SELECT, INSERT, UPDATE ON " + q + ".lease_buckets TO " + ro,
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + q + "." + workers + " TO " + ro,
	} {
		_, err := pool.Exec(context.Background(), stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP OWNED BY "+ro)
		_, _ = pool.Exec(context.Background(), "DROP ROLE IF EXISTS "+ro)
	})
	if workers == "lease_workers" {
		grantResizeTables(t, b, role)
	}
	return role
}

// grantResizeTables grants role what a worker needs on migration 0003's
// tables (docs/operations.md, roles).
func grantResizeTables(t *testing.T, b *testBundle, role string) {
	t.Helper()
	q, ro := pgx.Identifier{b.schema}.Sanitize(), pgx.Identifier{role}.Sanitize()
	for _, stmt := range []string{
		"GRANT SELECT, INSERT, UPDATE ON " + q + ".subscriptions, " + q + ".generations TO " + ro,
		"GRANT DELETE ON " + q + ".lease_buckets TO " + ro,
	} {
		_, err := pgtest.Pool(t).Exec(context.Background(), stmt)
		require.NoError(t, err, stmt)
	}
}

func rolePool(t *testing.T, role string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.MaxConns = role, 4
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	var super bool
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT rolsuper FROM pg_roles WHERE rolname = current_user").Scan(&super))
	require.False(t, super)
	return pool
}
