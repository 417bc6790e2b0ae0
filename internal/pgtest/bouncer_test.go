package pgtest

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// TestBouncerTransactionModeNeedsExecMode: through PgBouncer 1.18 in
// transaction mode, pgx's default exec mode prepares a named statement on
// one server connection and later runs it on another, which fails; the
// modes without named statements — BouncerExecMode (the URL the bouncer
// hands out, and the one docs/operations.md gives) among them — run the
// same sequence. (Which of them can run all of kumi's statements is
// eventsource's TestStoreThroughATransactionPooler.) The sequence is
// deterministic: a fresh bouncer has one server connection, which client B
// pins with an open transaction, so client A's next statement gets a new
// one.
func TestBouncerTransactionModeNeedsExecMode(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T, url string) error {
		b := NewBouncer(t, LocalServer(t), PoolTransaction)
		url = strings.Replace(b.URL, "&default_query_exec_mode="+BouncerExecMode, "", 1) + url
		a, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer a.Close(ctx)
		other, err := pgx.Connect(ctx, url)
		require.NoError(t, err)
		defer other.Close(ctx)

		var n, pidA1, pidB, pidA2 int
		require.NoError(t, a.QueryRow(ctx, "SELECT $1::int + 1, pg_backend_pid()", 1).Scan(&n, &pidA1))
		tx, err := other.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidB))
		require.Equal(t, pidA1, pidB, "B's transaction holds the server connection A used")
		err = a.QueryRow(ctx, "SELECT $1::int + 1, pg_backend_pid()", 2).Scan(&n, &pidA2)
		if err == nil {
			require.NotEqual(t, pidA1, pidA2, "A runs on another server connection")
			require.Equal(t, 3, n)
		}
		return err
	}

	t.Run("TheDefaultModeFails", func(t *testing.T) {
		err := run(t, "")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr)
		require.Equal(t, "26000", pgErr.Code, "invalid_sql_statement_name: %v", err)
	})
	for _, mode := range []string{BouncerExecMode, "describe_exec", "exec", "simple_protocol"} {
		t.Run("Mode_"+mode+"_Works", func(t *testing.T) {
			require.NoError(t, run(t, "&default_query_exec_mode="+mode))
		})
	}
}

// TestBouncerSessionModePinsTheServerConnection: in session mode a client
// keeps its server connection, and session state with it, while another
// client holds a transaction open.
func TestBouncerSessionModePinsTheServerConnection(t *testing.T) {
	ctx := context.Background()
	b := NewBouncer(t, LocalServer(t), PoolSession)
	a, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer a.Close(ctx)
	other, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer other.Close(ctx)

	var pid1, pidOther, pid2 int
	require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid1))
	tx, err := other.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pidOther))
	require.NotEqual(t, pid1, pidOther)
	require.NoError(t, a.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid2))
	require.Equal(t, pid1, pid2)
}

// TestACrashedBouncerIsStartedAgain: a bouncer whose process dies (as
// PgBouncer 1.18 does on an aborted cancel request) is started again on
// the same port, as a service manager would, and counts the crash; a
// stopped one is not.
func TestACrashedBouncerIsStartedAgain(t *testing.T) {
	ctx := context.Background()
	b := NewBouncer(t, LocalServer(t), PoolTransaction)
	one := func() error {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, b.URL)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		var n int
		return conn.QueryRow(cctx, "SELECT 1").Scan(&n)
	}
	require.NoError(t, one())
	conn, err := pgx.Connect(ctx, b.URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	b.Crash()
	var n int
	require.Error(t, conn.QueryRow(ctx, "SELECT 1").Scan(&n), "a connection through the crashed process")
	require.True(t, WaitFor(30*time.Second, func() bool { return one() == nil }), "no query through the bouncer after its crash")
	require.EqualValues(t, 1, b.Crashes())
	require.False(t, b.Exited())
	b.Stop()
	require.True(t, b.Exited())
	require.EqualValues(t, 1, b.Crashes(), "a stop is no crash")
}
