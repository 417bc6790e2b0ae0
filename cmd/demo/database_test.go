package main

import (
	"context"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// The hole: the embedded PostgreSQL ran `initdb -A trust` on 127.0.0.1,
// so while the demo ran any local process could connect as postgres, no
// password asked, and run COPY … FROM PROGRAM. Now it has a generated
// password (scram-sha-256), the demo prints its URL masked, and the
// inspect line works as printed: its PGPASSFILE supplies the password.
func TestTheEmbeddedDatabaseWantsAPasswordThatIsNeverPrinted(t *testing.T) {
	t.Parallel()
	_, err := pgtest.FindBinaries()
	require.NoError(t, err, "this test starts the embedded server: it needs the local server binaries")
	d := startDemo(t, nil, "-short", "-no-tui", "-duration", "10m", "-scenario=false")
	d.waitFor(t, `inspect:  .*\n`)
	d.waitFor(t, `w2 started \(pid \d+\)`)

	out := d.output()
	m := regexp.MustCompile(`inspect:  PGPASSFILE=(\S+) DATABASE_URL='(postgres://postgres@127\.0\.0\.1:\d+/postgres\?sslmode=disable)' `).
		FindStringSubmatch(out)
	require.NotNil(t, m, "the inspect line names a password file and a URL without a password:\n%s", out)
	passfile, url := m[1], m[2]
	require.Regexp(t, `database: embedded PostgreSQL postgres://postgres:xxxxx@127\.0\.0\.1:\d+/postgres`, out)

	fi, err := os.Stat(passfile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "the password file is the user's alone")
	b, err := os.ReadFile(passfile)
	require.NoError(t, err)
	fields := strings.Split(strings.TrimSpace(string(b)), ":")
	require.Len(t, fields, 5, "host:port:db:user:password")
	password := fields[4]
	require.GreaterOrEqual(t, len(password), 24)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = pgx.Connect(ctx, url)
	require.Error(t, err, "no password, no connection")
	require.Contains(t, err.Error(), "password authentication failed")
	_, err = pgx.Connect(ctx, strings.Replace(url, "postgres@", "postgres:wrong@", 1))
	require.Error(t, err, "a wrong password, no connection")
	conn, err := pgx.Connect(ctx, url+"&passfile="+passfile)
	require.NoError(t, err, "the inspect line's form connects")
	var method string
	require.NoError(t, conn.QueryRow(ctx, `SELECT rolpassword FROM pg_authid WHERE rolname = 'postgres'`).Scan(&method))
	require.True(t, strings.HasPrefix(method, "SCRAM-SHA-256$"), "the password is stored as scram")
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGINT))
	d.wait(t)
	require.NotContains(t, d.output(), password, "the password is never printed")
	_, err = os.Stat(passfile)
	require.True(t, os.IsNotExist(err), "the password file is removed on exit")
}
