package main

import (
	"context"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestDatabaseErrors(t *testing.T) {
	t.Parallel()
	t.Run("NoDatabaseIsAUsageError", func(t *testing.T) {
		t.Parallel()
		r := kumi(t, nil, "status")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "set DATABASE_URL or pass --database-url")
	})
	t.Run("UnparsableURLNeverShowsThePassword", func(t *testing.T) {
		t.Parallel()
		r := kumi(t, []string{"DATABASE_URL=postgres://admin:hunter2@127.0.0.1:notaport/db"}, "status")
		require.Equal(t, exitUsage, r.code, "a bad value: exit 2, as docs/operations.md says")
		require.Contains(t, r.stderr, "not a valid PostgreSQL connection string")
		require.Contains(t, r.stderr, "the port is not a number")
		require.NotContains(t, r.stdout+r.stderr, "hunter2")
	})
	t.Run("APasswordWithASlashNeverShows", func(t *testing.T) {
		t.Parallel()
		// The '/' ends the host part: the password's head is read as a port.
		r := kumi(t, []string{"DATABASE_URL=postgres://kumi:s3cr3tPrefix/Tail@127.0.0.1/db"}, "status")
		require.Equal(t, exitUsage, r.code, r.stderr)
		require.Contains(t, r.stderr, "%2F")
		require.NotContains(t, r.stdout+r.stderr, "s3cr3tPrefix")
		r = kumi(t, []string{"DATABASE_URL=postgres://kumi:ab%zzcd@127.0.0.1/db"}, "status")
		require.Equal(t, exitUsage, r.code, r.stderr)
		require.NotContains(t, r.stdout+r.stderr, "%zz")
	})
	t.Run("UnreachableServerNeverShowsThePassword", func(t *testing.T) {
		t.Parallel()
		port, err := pgtest.FreePort()
		require.NoError(t, err)
		r := kumi(t, nil, "--database-url", "postgres://admin:hunter2@127.0.0.1:"+itoa(port)+"/db?connect_timeout=5", "status")
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "cannot connect to the database")
		require.NotContains(t, r.stdout+r.stderr, "hunter2")
	})
	t.Run("KeyValueStringNeverShowsThePassword", func(t *testing.T) {
		t.Parallel()
		port, err := pgtest.FreePort()
		require.NoError(t, err)
		r := kumi(t, []string{"DATABASE_URL=host=127.0.0.1 port=" + itoa(port) + " user=admin password=hunter2 connect_timeout=5"}, "status")
		require.Equal(t, exitRuntime, r.code)
		require.NotContains(t, r.stdout+r.stderr, "hunter2")
	})
	t.Run("ConnectionErrorSaysItOnce", func(t *testing.T) {
		t.Parallel()
		// sslmode=prefer (the default): pgconn tries TLS first, and lists
		// that attempt's "server refused TLS connection" too.
		u, err := url.Parse(pgtest.URL(t))
		require.NoError(t, err)
		u.User = url.UserPassword("nosuchrole", "hunter2")
		u.RawQuery = ""
		r := kumi(t, []string{"DATABASE_URL=" + u.String()}, "status")
		require.Equal(t, exitRuntime, r.code, r.stderr)
		require.Contains(t, r.stderr, `role "nosuchrole" does not exist`)
		require.NotContains(t, r.stderr, "tls error")
		require.Equal(t, 1, strings.Count(strings.TrimSpace(r.stderr), "\n")+1, "one line: %s", r.stderr)
		require.NotContains(t, r.stdout+r.stderr, "hunter2")
	})
	t.Run("UnmigratedSchemaSaysToMigrate", func(t *testing.T) {
		t.Parallel()
		r := kumi(t, []string{"DATABASE_URL=" + pgtest.URL(t)}, "--schema", pgtest.NewSchema(t), "status")
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "kumi migrate")
	})
}

// Every command refuses a subscription the schema does not know, and a
// bucket beyond the subscription's N, as status does (issue 15).
func TestUnknownSubscriptionsAndBucketsAreRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := b.lease(t, "balances", "worker-a", 4).Pass(context.Background())
	require.NoError(t, err)
	unknown := uuid.NewString()
	for _, args := range [][]string{
		{"dead-letters", "list", "-s", "nosuch"},
		{"dead-letters", "show", "-s", "nosuch", unknown},
		{"dead-letters", "replay", "-s", "nosuch", "--dry-run"},
		{"dead-letters", "discard", "-s", "nosuch", unknown},
		{"relinquish", "-s", "nosuch", "--bucket", "0"},
		{"status", "-s", "nosuch"},
		{"checkpoints", "show", "-s", "nosuch", "--json"},
		{"checkpoints", "reset", "-s", "nosuch", "--bucket", "0", "--position", "0"},
	} {
		r := b.run(t, args...)
		require.Equal(t, exitRuntime, r.code, "kumi %q: %s%s", args, r.stdout, r.stderr)
		require.Regexp(t, `subscription "nosuch" (is unknown|has no buckets)`, r.stderr, "kumi %q", args)
	}
	for _, args := range [][]string{
		{"dead-letters", "list", "-s", "balances", "--bucket", "99"},
		{"dead-letters", "replay", "-s", "balances", "--bucket", "4", "--dry-run"},
		{"relinquish", "-s", "balances", "--bucket", "4"},
		{"checkpoints", "reset", "-s", "balances", "--bucket", "4", "--position", "0"},
	} {
		r := b.run(t, args...)
		require.Equal(t, exitUsage, r.code, "kumi %q: %s%s", args, r.stdout, r.stderr)
		require.Contains(t, r.stderr, `subscription "balances" has buckets 0 to 3`, "kumi %q", args)
	}
	r := b.run(t, "dead-letters", "list", "-s", "balances", "--bucket", "3")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `"balances" has no pending dead letters`)
}

// No usage text, error or log line shows a password: every command's help,
// a bad flag and a bad value, with the URL in the environment or on the
// command line (issue 15).
func TestNoOutputShowsThePassword(t *testing.T) {
	t.Parallel()
	port, err := pgtest.FreePort()
	require.NoError(t, err)
	secret := "postgres://admin:hunter2@127.0.0.1:" + itoa(port) + "/db?connect_timeout=5"
	commands := [][]string{{"migrate"}, {"status"}, {"dead-letters", "list"}, {"dead-letters", "show"},
		{"dead-letters", "replay"}, {"dead-letters", "discard"}, {"checkpoints", "show"}, {"checkpoints", "reset"},
		{"relinquish"}}
	var runs [][]string
	runs = append(runs, []string{"--help"}, []string{"--bogus"}, nil)
	for _, c := range commands {
		runs = append(runs, append(slices.Clone(c), "--help"), append(slices.Clone(c), "--bogus"))
	}
	runs = append(runs, []string{"status"}, []string{"dead-letters", "list", "-s", "x"})
	for _, args := range runs {
		for _, how := range []string{"env", "flag"} {
			env, argv := []string{"DATABASE_URL=" + secret}, args
			if how == "flag" {
				env, argv = nil, append([]string{"--database-url", secret}, args...)
			}
			r := kumi(t, env, argv...)
			require.NotContains(t, r.stdout+r.stderr, "hunter2", "kumi %q (URL in the %s)", args, how)
		}
	}
}
