package main

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

func TestUsage(t *testing.T) {
	t.Parallel()
	db := []string{"DATABASE_URL=" + pgtest.URL(t)}
	cases := []struct {
		name   string
		args   []string
		code   int
		stream string // "stdout" or "stderr"
		want   string
	}{
		{"NoArgumentsPrintsHelpToStderr", nil, exitUsage, "stderr", "Usage: kumi <command>"},
		{"HelpExitsZero", []string{"--help"}, exitOK, "stdout", "relinquish"},
		{"CommandHelpNamesItsFlags", []string{"checkpoints", "reset", "--help"}, exitOK, "stdout", "--force"},
		{"UnknownCommand", []string{"frobnicate"}, exitUsage, "stderr", `kumi: unexpected argument frobnicate`},
		{"FlagWithoutValue", []string{"status", "-s"}, exitUsage, "stderr", "kumi status: --subscription needs a value\n"},
		{"Version", []string{"--version"}, exitOK, "stdout", "kumi "},
		// The console package's refusal, once prefixed: not "kumi console: console: …".
		{"ConsoleShortToken", []string{"console", "--token", "short", "--listen", "127.0.0.1:0"}, exitUsage, "stderr", "kumi console: --token: 5 bytes"},
		{"HelpShowsTheSchemaDefault", []string{"--help"}, exitOK, "stdout", "(default: kumi)"},
		{"ResizeHelpSaysTheLimit", []string{"resize", "--help"}, exitOK, "stdout", "1 to " + strconv.Itoa(leasestore.MaxBuckets)},
		{"UnknownFlag", []string{"status", "--bogus"}, exitUsage, "stderr", "unknown flag --bogus"},
		{"MissingSubcommand", []string{"dead-letters"}, exitUsage, "stderr", `expected one of "list"`},
		{"MissingRequiredFlag", []string{"dead-letters", "list"}, exitUsage, "stderr", "--subscription"},
		{"BadNumber", []string{"relinquish", "-s", "x", "--bucket", "two"}, exitUsage, "stderr", "--bucket"},
		{"NegativeBucket", []string{"relinquish", "-s", "x", "--bucket=-1"}, exitUsage, "stderr", "numbered from 0"},
		// A separate negative value is the same value, not a short flag.
		{"NegativeBucketSeparate", []string{"relinquish", "-s", "x", "--bucket", "-1"}, exitUsage, "stderr", "--bucket -1: buckets are numbered from 0"},
		{"NegativeWaitSeparate", []string{"relinquish", "-s", "x", "--bucket", "1", "--wait", "-5s"}, exitUsage, "stderr", "--wait -5s: must not be negative"},
		{"NegativeAfterSeparate", []string{"dead-letters", "list", "-s", "x", "--after", "-5"}, exitUsage, "stderr", "--after -5: positions are >= 0"},
		{"NegativePositionSeparate", []string{"checkpoints", "reset", "-s", "x", "--bucket", "1", "--position", "-5"}, exitUsage, "stderr", "positions are >= 0"},
		// Beyond int4: refused before the database is asked, by every command.
		{"HugeBucketList", []string{"dead-letters", "list", "-s", "x", "--bucket", "2147483648"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"HugeBucketReplay", []string{"dead-letters", "replay", "-s", "x", "--bucket", "2147483648", "--dry-run"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"HugeBucketReset", []string{"checkpoints", "reset", "-s", "x", "--bucket", "2147483648", "--position", "0"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"HugeBucketRelinquish", []string{"relinquish", "-s", "x", "--bucket", "2147483648"}, exitUsage, "stderr", "--bucket 2147483648: buckets are numbered from 0 to 8191 at most"},
		{"BadEventID", []string{"dead-letters", "show", "-s", "x", "nope"}, exitUsage, "stderr", `"nope" is not a UUID`},
		{"ReplayNeedsExec", []string{"dead-letters", "replay", "-s", "x"}, exitUsage, "stderr", "--exec COMMAND"},
		{"ResetNeedsBuckets", []string{"checkpoints", "reset", "-s", "x", "--position", "0"}, exitUsage, "stderr", "--bucket B"},
		{"ResetNeedsPosition", []string{"checkpoints", "reset", "-s", "x", "--bucket", "1"}, exitUsage, "stderr", "--position"},
		{"ResetNegativePosition", []string{"checkpoints", "reset", "-s", "x", "--bucket", "1", "--position=-5"}, exitUsage, "stderr", "positions are >= 0"},
		{"CategoryWithoutSubscription", []string{"status", "-c", "account"}, exitUsage, "stderr", "--category needs --subscription"},
		{"BadGroupSize", []string{"migrate", "--group-size", "0"}, exitUsage, "stderr", "--group-size 0"},
		{"InvalidSubscriptionName", []string{"status", "-s", " padded"}, exitUsage, "stderr", "white space"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			r := kumi(t, db, c.args...)
			require.Equal(t, c.code, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
			out := r.stdout
			if c.stream == "stderr" {
				out = r.stderr
			}
			require.Contains(t, out, c.want)
		})
	}
}

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

func TestMigrate(t *testing.T) {
	t.Parallel()
	schema := pgtest.NewSchema(t)
	env := []string{"DATABASE_URL=" + pgtest.URL(t)}
	// It says when it creates the schema (a mistyped --schema shows), then
	// that the schema is up to date: idempotent.
	for _, want := range []string{`created schema "` + schema + `": `, `schema "` + schema + `" is up to date: `} {
		r := kumi(t, env, "--schema", schema, "migrate", "--group-size", "4")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, want+"eventsource version 6, leasestore version 5")
		require.Contains(t, r.stdout, "consumer-group index for 4 buckets: present")
	}
	var n int
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND indexname = 'events_cg_4'`, schema).Scan(&n))
	require.Equal(t, 1, n)
	r := kumi(t, env, "--schema", schema, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "has no subscriptions yet")

	// The ownership record's retention is set with it, and refused negative.
	r = kumi(t, env, "--schema", schema, "migrate", "--ownership-retention", "720h")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "ownership record: keeps changes for 720h0m0s")
	var keep time.Duration
	require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
		`SELECT keep FROM `+pgx.Identifier{schema, "ownership_retention"}.Sanitize()).Scan(&keep))
	require.Equal(t, 720*time.Hour, keep)
	r = kumi(t, env, "--schema", schema, "migrate", "--ownership-retention=-1h")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "--ownership-retention -1h0m0s: must not be negative")
}

// A schema that exists without kumi's tables is migrated, and says so; a
// name is quoted, so any name eventsource accepts works, and one it
// refuses is a usage error naming the rule.
func TestMigrateSchemaNames(t *testing.T) {
	t.Parallel()
	env := []string{"DATABASE_URL=" + pgtest.URL(t)}
	schema := pgtest.NewSchema(t)
	_, err := pgtest.Pool(t).Exec(context.Background(), `CREATE SCHEMA `+schema)
	require.NoError(t, err)
	r := kumi(t, env, "--schema", schema, "migrate")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `schema "`+schema+`" migrated to eventsource version 6, leasestore version 5 (was: no kumi tables)`)

	odd := pgtest.NewSchema(t) + " Odd!"
	t.Cleanup(func() {
		_, _ = pgtest.Pool(t).Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+odd+`" CASCADE`)
	})
	r = kumi(t, env, "--schema", odd, "migrate")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, `created schema "`+odd+`"`)

	r = kumi(t, env, "--schema", "pg_mine", "migrate")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, `--schema: `)
	require.Contains(t, r.stderr, `"pg_"`)
	r = kumi(t, env, "--schema", strings.Repeat("s", 64), "migrate")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, "longer than the 63 PostgreSQL keeps")
}

func TestStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	const n = 4
	evs := b.appendEvents(t, "account", 10, 40)
	a := b.lease(t, "balances", "worker-a", n)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, n)
	// Bucket 1 has handled everything up to the 10th event.
	_, err = b.store.SaveCheckpoint(ctx, "balances", 1, evs[9].Position, a.Fence(1, res.Owned[1].Epoch))
	require.NoError(t, err)
	wantLag := map[int]int64{}
	for _, e := range evs {
		if bk := e.Bucket(n); bk != 1 || e.Position > evs[9].Position {
			wantLag[bk]++
		}
	}

	t.Run("TableShowsWorkersOwnersAndLag", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "-c", "account")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, `subscription "balances" in schema "`+b.schema+`": 4 buckets, 4 held, 1 live worker, head position 40`)
		require.Regexp(t, `(?m)^worker-a\s+row\s+yes\s+\S+ ago\s+in \S+\s+4$`, r.stdout)
		require.Regexp(t, `(?m)^1\s+worker-a\s+1\s+in \S+\s+-\s+`+itoa(int(evs[9].Position))+`\s+`+itoa(int(wantLag[1]))+`\b`, r.stdout)
	})
	t.Run("JSONHasEveryField", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "-c", "account", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		st := decode[statusOut](t, r.stdout)
		require.Equal(t, "balances", st.Subscription)
		require.Equal(t, n, st.BucketCount)
		require.EqualValues(t, 40, st.Head)
		require.Len(t, st.Workers, 1)
		require.True(t, st.Workers[0].Live)
		require.Equal(t, n, st.Workers[0].Owns)
		require.Len(t, st.Buckets, n)
		for _, bk := range st.Buckets {
			require.Equal(t, "worker-a", bk.Owner)
			require.EqualValues(t, 1, bk.Epoch)
			require.NotNil(t, bk.ExpiresInSeconds)
			require.Greater(t, *bk.ExpiresInSeconds, 0.0)
			require.NotNil(t, bk.Lag)
			require.Equal(t, wantLag[bk.Bucket], *bk.Lag, "bucket %d", bk.Bucket)
		}
		require.Equal(t, evs[9].Position, st.Buckets[1].Checkpoint)
	})
	t.Run("AMistypedCategoryIsRefused", func(t *testing.T) {
		t.Parallel()
		// "accounts" has no events, and balances has handled some of
		// "account": its lag would read 0 everywhere, all caught up.
		r := b.run(t, "status", "-s", "balances", "-c", "accounts")
		require.Equal(t, exitUsage, r.code, "stdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
		require.Contains(t, r.stderr, `category "accounts" has no events, yet subscription "balances" has handled events up to position `+
			itoa(int(evs[9].Position))+`: it is not the subscription's category (categories with events: account)`)
		require.Empty(t, r.stdout)
	})
	t.Run("ACategoryWithNoEventsIsWarnedOfBeforeAnyIsHandled", func(t *testing.T) {
		t.Parallel()
		fresh := b.lease(t, "fresh", "worker-f", 2)
		_, err := fresh.Pass(ctx)
		require.NoError(t, err)
		r := b.run(t, "status", "-s", "fresh", "-c", "accounts")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, `warning: category "accounts" has no events: a lag of 0 means nothing to read; `+
			`check it is the subscription's (categories with events: account)`)
		r = b.run(t, "status", "-s", "fresh", "-c", "accounts", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		st := decode[statusOut](t, r.stdout)
		require.True(t, st.CategoryEmpty)
		require.Equal(t, []string{"account"}, st.Categories)
		r = b.run(t, "status", "-s", "fresh", "-c", "account")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.NotContains(t, r.stdout, "warning")
	})
	t.Run("WithoutCategoryLagIsUnknown", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		for _, bk := range decode[statusOut](t, r.stdout).Buckets {
			require.Nil(t, bk.Lag)
		}
	})
	t.Run("OverviewListsSubscriptions", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Regexp(t, `(?m)^balances\s+4\s+4\s+1\s+1\s+0$`, r.stdout)
		r = b.run(t, "status", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, `"subscription": "balances"`)
	})
	t.Run("UnknownSubscriptionIsAnError", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "nope")
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, `subscription "nope" has no buckets`)
	})
	t.Run("StatusJoinsNoPool", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "status", "-s", "balances", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Len(t, decode[statusOut](t, r.stdout).Workers, 1, "status must not register itself as a worker")
	})
}

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "order", 3, 6)
	for i, e := range evs[:4] {
		_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", Bucket: i % 2,
			EventID: e.ID, Reason: "boom " + itoa(i) + "\nsecond line", Attempts: 5})
		require.NoError(t, err)
	}
	_, err := b.store.SaveCheckpoint(ctx, "shipping", 0, evs[5].Position, nil)
	require.NoError(t, err)

	t.Run("ListShowsPendingLettersByPosition", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "dead-letters", "list", "-s", "shipping")
		require.Equal(t, exitOK, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 5, r.stdout)
		require.Contains(t, lines[1], evs[0].ID.String())
		require.Contains(t, lines[1], "boom 0 second line")
		r = b.run(t, "dead-letters", "list", "-s", "shipping", "--bucket", "1", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		ls := decode[[]letterJSON](t, r.stdout)
		require.Len(t, ls, 2)
		require.Equal(t, evs[1].ID, ls[0].EventID)
		require.Equal(t, evs[3].ID, ls[1].EventID)
		r = b.run(t, "dead-letters", "list", "-s", "shipping", "--limit", "1")
		require.Contains(t, r.stdout, "(more may follow: --after "+itoa(int(evs[0].Position))+")")
	})
	t.Run("ShowPrintsTheLetterAndItsEvent", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "dead-letters", "show", "-s", "shipping", evs[2].ID.String())
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "stream        "+evs[2].Stream)
		require.Contains(t, r.stdout, "type          Deposited")
		require.Contains(t, r.stdout, `"i": 2`)
		r = b.run(t, "dead-letters", "show", "-s", "shipping", evs[2].ID.String(), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		type shown struct {
			letterJSON
			Event *eventJSON `json:"event"`
		}
		got := decode[shown](t, r.stdout)
		require.Equal(t, 5, got.Attempts)
		require.NotNil(t, got.Event)
		require.JSONEq(t, `{"i":2}`, string(got.Event.Data))
	})
	t.Run("ShowKeepsTheFirstReason", func(t *testing.T) {
		t.Parallel()
		for _, reason := range []string{"the first failure", "the second failure"} {
			_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "history", EventID: evs[5].ID, Reason: reason, Attempts: 5})
			require.NoError(t, err)
		}
		r := b.run(t, "dead-letters", "show", "-s", "history", evs[5].ID.String())
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "reason        the second failure")
		require.Contains(t, r.stdout, "first reason  the first failure (after 5 attempts; replaced ")
		r = b.run(t, "dead-letters", "show", "-s", "history", evs[5].ID.String(), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		got := decode[letterJSON](t, r.stdout)
		require.Len(t, got.History, 1)
		require.Equal(t, "the first failure", got.History[0].Reason)
	})
	t.Run("ShowUnknownLetterIsAnError", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "dead-letters", "show", "-s", "shipping", uuid.NewString())
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "kumi dead-letters show: dead letter not found")
		require.NotContains(t, r.stderr, "kumi: ", "kumi said twice")
	})
}

// Replay and discard change the letters, so they have a schema of their own.
func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "order", 3, 5)
	for _, e := range evs {
		_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", Bucket: 0,
			EventID: e.ID, Reason: "boom", Attempts: 3})
		require.NoError(t, err)
	}
	_, err := b.store.SaveCheckpoint(ctx, "shipping", 0, evs[4].Position, nil)
	require.NoError(t, err)
	dir := t.TempDir()

	// A failing command stops the replay and leaves that letter pending.
	r := b.run(t, "dead-letters", "replay", "-s", "shipping", "--event", evs[1].ID.String(),
		"--exec", `echo "no luck" >&2; exit 3`)
	require.Equal(t, exitRuntime, r.code, r.stdout)
	require.Contains(t, r.stderr, "exit status 3: no luck")
	require.Contains(t, r.stderr, "stays pending")
	d, err := b.store.DeadLetter(ctx, "shipping", evs[1].ID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt)
	require.Equal(t, 4, d.Attempts)

	// One event by id, as show and discard take it: the command gets it
	// as JSON, and its environment. (The first replay above used the
	// former form, --event ID.)
	out := filepath.Join(dir, "one.json")
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", evs[1].ID.String(),
		"--exec", `cat > `+out+`; echo "$KUMI_EVENT_ID $KUMI_STREAM $KUMI_POSITION $KUMI_SUBSCRIPTION" >> `+out)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "replayed 1 dead letter(s)")
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	require.Len(t, lines, 2)
	ev := decode[eventJSON](t, lines[0])
	require.Equal(t, evs[1].ID, ev.EventID)
	require.Equal(t, "shipping", ev.Subscription)
	require.Equal(t, evs[1].ID.String()+" "+evs[1].Stream+" "+itoa(int(evs[1].Position))+" shipping", lines[1])

	// Already replayed: skipped unless --again.
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--event", evs[1].ID.String(), "--exec", "true")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "already replayed")

	// Dry run lists the rest and changes nothing.
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "4 dead letter(s) would be replayed")

	// The rest, in position order, through one command each.
	log := filepath.Join(dir, "all.log")
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--exec", `echo "$KUMI_POSITION" >> `+log)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "replayed 4 dead letter(s)")
	got, err = os.ReadFile(log)
	require.NoError(t, err)
	want := []string{}
	for _, i := range []int{0, 2, 3, 4} {
		want = append(want, itoa(int(evs[i].Position)))
	}
	require.Equal(t, want, strings.Fields(string(got)))

	// Replay never moves the checkpoint.
	cp, err := b.store.Checkpoint(ctx, "shipping", 0)
	require.NoError(t, err)
	require.Equal(t, evs[4].Position, cp)
	r = b.run(t, "dead-letters", "list", "-s", "shipping")
	require.Contains(t, r.stdout, "no pending dead letters")
	r = b.run(t, "dead-letters", "list", "-s", "shipping", "--all", "--json")
	require.Len(t, decode[[]letterJSON](t, r.stdout), 5)

	// Discard deletes; a missing one is an error naming it.
	r = b.run(t, "dead-letters", "discard", "-s", "shipping", evs[0].ID.String())
	require.Equal(t, exitOK, r.code, r.stderr)
	r = b.run(t, "dead-letters", "discard", "-s", "shipping", evs[0].ID.String())
	require.Equal(t, exitRuntime, r.code)
	require.Contains(t, r.stderr, "no dead letter for event "+evs[0].ID.String())
}

func TestCheckpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "account", 8, 20)
	a := b.lease(t, "balances", "worker-a", 4)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	for _, l := range res.Owned {
		_, err := b.store.SaveCheckpoint(ctx, "balances", l.Bucket, evs[19].Position, a.Fence(l.Bucket, l.Epoch))
		require.NoError(t, err)
	}

	r := b.run(t, "checkpoints", "show", "-s", "balances", "-c", "account")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Regexp(t, `(?m)^2\s+20\s+\S+ ago\s+worker-a\s+1\s+0$`, r.stdout)

	// Refused while worker-a holds the bucket, naming the owner.
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", "0")
	require.Equal(t, exitRuntime, r.code, r.stdout)
	require.Contains(t, r.stderr, "bucket 2 is held by worker-a (epoch 1")
	require.Contains(t, r.stderr, "--force")
	cp, err := b.store.Checkpoint(ctx, "balances", 2)
	require.NoError(t, err)
	require.Equal(t, evs[19].Position, cp)

	// --force resets it anyway, with a warning.
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", "5", "--force")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 2: checkpoint 20 -> 5")
	require.Contains(t, r.stderr, "warning: bucket 2 is held by worker-a")
	cp, err = b.store.Checkpoint(ctx, "balances", 2)
	require.NoError(t, err)
	require.EqualValues(t, 5, cp)
	// ... and the owner is fenced out: its in-memory position cannot undo it.
	_, err = b.store.SaveCheckpoint(ctx, "balances", 2, evs[19].Position, a.Fence(2, 1))
	require.ErrorIs(t, err, eventsource.ErrFenceLost)

	// A position past the head is refused unless asked for.
	past := strconv.FormatInt(evs[19].Position+1, 10)
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", past, "--force")
	require.Equal(t, exitUsage, r.code, r.stdout)
	require.Contains(t, r.stderr, "past the store's head ("+strconv.FormatInt(evs[19].Position, 10)+")")
	require.Contains(t, r.stderr, "--beyond-head")
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "2", "--position", past, "--force", "--beyond-head")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 2: checkpoint 5 -> "+past)

	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "4", "--position", "0")
	require.Equal(t, exitUsage, r.code)
	require.Contains(t, r.stderr, "has buckets 0 to 3")

	// Once the owner has left, every bucket resets, backwards.
	require.NoError(t, a.Leave(ctx))
	r = b.run(t, "checkpoints", "reset", "-s", "balances", "--all-buckets", "--position", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 3: checkpoint 20 -> 0")
	r = b.run(t, "checkpoints", "show", "-s", "balances", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	cps := decode[[]checkpointJSON](t, r.stdout)
	require.Len(t, cps, 4)
	for _, c := range cps {
		require.Zero(t, c.Position)
		require.Empty(t, c.Owner)
	}
}

// The owner's passes stop past its TTL and nobody claims its bucket; the
// operator resets; the owner comes back: its next checkpoint write, from
// its in-memory position, must not undo the reset.
func TestCheckpointResetOnALapsedLeaseIsNotUndoneByItsOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "account", 2, 20)
	a, err := leasestore.New(b.store.Pool(), leasestore.Config{Schema: b.schema, Subscription: "balances",
		Worker: "worker-a", Buckets: 1, LeaseOptions: leasestore.LeaseOptions{NoListen: true, TTL: 600 * time.Millisecond, Heartbeat: 250 * time.Millisecond, Margin: 200 * time.Millisecond},
	})
	if err == nil {
		err = a.Start(ctx)
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	l := res.Claimed[0]
	_, err = b.store.SaveCheckpoint(ctx, "balances", 0, evs[9].Position, a.Fence(0, l.Epoch))
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() bool {
		snap, err := a.Snapshot(ctx)
		require.NoError(t, err)
		return !snap.Buckets[0].Held(snap.Now)
	}, "the lease never lapsed")

	r := b.run(t, "checkpoints", "reset", "-s", "balances", "--bucket", "0", "--position", "0")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "bucket 0: checkpoint "+strconv.FormatInt(evs[9].Position, 10)+" -> 0")
	require.Contains(t, r.stdout, "earlier holders fenced out (epoch 1 -> 2)")

	// The owner recovers and writes from where its reader was.
	_, err = b.store.SaveCheckpoint(ctx, "balances", 0, evs[19].Position, a.Fence(0, l.Epoch))
	require.ErrorIs(t, err, eventsource.ErrFenceLost)
	cp, err := b.store.Checkpoint(ctx, "balances", 0)
	require.NoError(t, err)
	require.Zero(t, cp, "the reset stands")
	res, err = a.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{0}, res.Lost, "its reader stops, and restarts at the new epoch from the reset")
	require.EqualValues(t, 2, res.Claimed[0].Epoch)
}

func TestRelinquish(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	a := b.lease(t, "balances", "worker-a", 4)
	// worker-b joined (New registers it) but has run no pass: worker-a
	// takes its fair share of two, and worker-b is the least loaded.
	bw := b.lease(t, "balances", "worker-b", 4)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, 2)
	bucket, epoch := res.Owned[0].Bucket, res.Owned[0].Epoch
	free := -1
	for i := range 4 {
		if !slices.ContainsFunc(res.Owned, func(l leasestore.Lease) bool { return l.Bucket == i }) {
			free = i
			break
		}
	}

	t.Run("RefusesAFreeBucket", func(t *testing.T) {
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(free))
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "has no owner")
	})
	t.Run("RefusesATargetThatIsNotAWorker", func(t *testing.T) {
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--to", "ghost")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "--to ghost: not a live worker")
	})
	t.Run("RefusesTheOwnerAsTarget", func(t *testing.T) {
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--to", "worker-a")
		require.Equal(t, exitUsage, r.code)
	})

	// Ask, and wait in the background while the two workers run their passes.
	cmd := exec.Command(kumiBin, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--wait", "30s")
	cmd.Env = cleanEnv(b.env)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var claim string
		_ = b.store.Pool().QueryRow(ctx, `SELECT coalesce(claim_worker, '') FROM `+b.store.QuotedSchema()+
			`.lease_buckets WHERE subscription = 'balances' AND bucket = $1`, bucket).Scan(&claim)
		return claim == "worker-b"
	}, "the claim for worker-b is placed")

	again := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(bucket))
	require.Equal(t, exitRuntime, again.code)
	require.Contains(t, again.stderr, "already has a pending claim by worker-b")

	// The owner's next pass sees the claim: it drains and hands over.
	res, err = a.Pass(ctx)
	require.NoError(t, err)
	require.Equal(t, []int{bucket}, res.HandOff)
	require.NoError(t, a.HandOver(ctx, bucket))
	// The claimant activates it at the next epoch.
	resB, err := bw.Pass(ctx)
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(resB.Claimed, func(l leasestore.Lease) bool {
		return l.Bucket == bucket && l.Epoch == epoch+1
	}), "claimed: %+v", resB.Claimed)

	require.NoError(t, cmd.Wait(), out.String())
	// Short and structured: a line each, the request, what comes next,
	// what happened (then any other bucket that moved meanwhile).
	require.True(t, strings.HasPrefix(out.String(), "asked worker-a to hand bucket "+itoa(bucket)+" (epoch 1) over to worker-b\n"+
		"next: the owner hands it over on its next pass; worker-b (then 1 of its fair share 2) takes it on its own\n"+
		"bucket "+itoa(bucket)+" is now held by worker-b at epoch 2\n"), out.String())

	t.Run("HistorySaysWhoAskedAndWhatMoved", func(t *testing.T) {
		r := b.run(t, "status", "-s", "balances", "--history", "--bucket", itoa(bucket), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		changes := decode[[]leasestore.OwnershipChange](t, r.stdout)
		kinds := make([]string, len(changes))
		for i, c := range changes {
			kinds[i] = c.Kind
		}
		// Newest first: the handoff, the release, the request, the claim;
		// the joins of the pool (no bucket) among them.
		var story []string
		for _, c := range changes {
			if c.Bucket >= 0 {
				story = append(story, c.Kind+" "+c.From+"->"+c.To)
			}
		}
		require.Equal(t, []string{"handoff worker-a->worker-b", "release worker-a->", "request worker-a->worker-b",
			"claim ->worker-a"}, story, "%v", kinds)
		for _, c := range changes {
			if c.Kind == "request" {
				require.Equal(t, "kumi relinquish", c.Application, "the operator's command, by name")
			}
		}
		r = b.run(t, "status", "-s", "balances", "--history", "--bucket", itoa(bucket), "--limit", "3")
		require.Equal(t, exitOK, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 5, "a title, a header and three changes:\n%s", r.stdout)
		require.Contains(t, lines[1], "TIME")
		require.Contains(t, lines[2], "handoff")
		require.Contains(t, lines[2], "worker-b had claimed it at ")

		r = b.run(t, "status", "-s", "balances", "--bucket", "1")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "need --history")
		r = b.run(t, "status", "--history")
		require.Equal(t, exitUsage, r.code)
		require.Contains(t, r.stderr, "--history needs --subscription")
	})

	t.Run("RefusesWhenNobodyElseIsLive", func(t *testing.T) {
		require.NoError(t, bw.Leave(ctx))
		_, err := a.Pass(ctx)
		require.NoError(t, err)
		own := a.Held()[0].Bucket
		r := b.run(t, "relinquish", "-s", "balances", "--bucket", itoa(own))
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "worker-a is the only live worker")
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

func itoa(i int) string { return strconv.Itoa(i) }

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

// relinquishAtShare sets up worker-a and worker-b holding two of four
// buckets each, starts `kumi relinquish --wait` on one of worker-a's
// buckets (whose claimant, worker-b, is then at its share) and waits until
// the claim is placed. It returns the workers, the bucket and the command.
func relinquishAtShare(t *testing.T) (b *bundle, a, bw *leasestore.Store, bucket int, wait func() string) {
	t.Helper()
	ctx := context.Background()
	b = setup(t)
	a = b.lease(t, "balances", "worker-a", 4)
	bw = b.lease(t, "balances", "worker-b", 4)
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, res.Owned, 2)
	resB, err := bw.Pass(ctx)
	require.NoError(t, err)
	require.Len(t, resB.Owned, 2)
	bucket = res.Owned[0].Bucket
	cmd := exec.Command(kumiBin, "relinquish", "-s", "balances", "--bucket", itoa(bucket), "--wait", "60s", "-v")
	cmd.Env = cleanEnv(b.env)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Start())
	pgtest.Eventually(t, 20*time.Second, func() bool {
		var claim string
		_ = b.store.Pool().QueryRow(ctx, `SELECT coalesce(claim_worker, '') FROM `+b.store.QuotedSchema()+
			`.lease_buckets WHERE subscription = 'balances' AND bucket = $1`, bucket).Scan(&claim)
		return claim == "worker-b"
	}, "the claim for worker-b is placed")
	return b, a, bw, bucket, func() string {
		require.NoError(t, cmd.Wait(), out.String())
		return out.String()
	}
}

// relinquish to a worker already at its fair share said "it will withdraw
// the claim", then the claimant kept the bucket while another moved: it
// says what each order of passes leads to, and reports what happened
// (issue 15).
func TestRelinquishToAWorkerAtItsShare(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const predicted = "note: worker-b is at its fair share already (2 of ceil(4/2) = 2), so this claim puts it above: "
	t.Run("ClaimantPassesFirstAndWithdraws", func(t *testing.T) {
		t.Parallel()
		_, a, bw, bucket, wait := relinquishAtShare(t)
		_, err := bw.Pass(ctx)
		require.NoError(t, err)
		res, err := a.Pass(ctx)
		require.NoError(t, err)
		require.Empty(t, res.HandOff)
		out := wait()
		require.Contains(t, out, predicted)
		require.Contains(t, out, "worker-b withdraws the claim and worker-a keeps bucket "+itoa(bucket))
		require.Contains(t, out, "the claim was withdrawn: worker-a still holds bucket "+itoa(bucket)+" at epoch 1")
		require.NotContains(t, out, "meanwhile")
	})
	t.Run("OwnerPassesFirstAndTheyTrade", func(t *testing.T) {
		t.Parallel()
		_, a, bw, bucket, wait := relinquishAtShare(t)
		res, err := a.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, []int{bucket}, res.HandOff)
		require.Len(t, res.Requested, 1, "worker-a, below its share, claims one of worker-b's buckets: %+v", res)
		other := res.Requested[0].Bucket
		require.NoError(t, a.HandOver(ctx, bucket))
		resB, err := bw.Pass(ctx)
		require.NoError(t, err)
		require.Equal(t, []int{other}, resB.HandOff)
		require.NoError(t, bw.HandOver(ctx, other))
		_, err = a.Pass(ctx)
		require.NoError(t, err)
		out := wait()
		require.Contains(t, out, predicted)
		require.Contains(t, out, "worker-b takes bucket "+itoa(bucket)+" and gives another bucket to worker-a")
		require.Contains(t, out, "bucket "+itoa(bucket)+" is now held by worker-b at epoch 2")
		require.Contains(t, out, "meanwhile bucket "+itoa(other)+" moved from worker-b to worker-a (epoch 2)")
	})
}

// relinquish printed a 900-character paragraph naming the two workers nine
// times (issue 30): without -v it is a line, each worker named once.
func TestRelinquishIsShortWithoutVerbose(t *testing.T) {
	t.Parallel()
	owner, target := uuid.NewString(), uuid.NewString()
	in := inspect.Inspection{Buckets: 4, Workers: []leasestore.WorkerState{
		{Worker: owner, Live: true}, {Worker: target, Live: true}}}
	load := map[string]int{owner: 2, target: 2}
	short := predict(in, 3, owner, target, load, false)
	require.Len(t, short, 1)
	require.Less(t, len(short[0]), 200, short[0])
	require.Equal(t, 1, strings.Count(short[0], target), short[0])
	require.NotContains(t, short[0], owner, short[0])
	long := predict(in, 3, owner, target, load, true)
	require.Greater(t, len(long), 1, "-v explains")
	for _, l := range long {
		require.Less(t, len(l), 240, "one line each: %s", l)
	}
}

// A failover that handed positions out again is recorded (eventsource's
// TestFailover promotes a real standby; here the record's own function
// stands in for the finders), and status warns of it until it is a week
// old; --failovers prints the record.
func TestStatusWarnsOfAFailoverThatReusedPositions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	r := b.run(t, "status", "--failovers")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "has recorded no change of server")

	note := `SELECT ` + b.store.QuotedSchema() + `.note_server_change($1, '7', 1, '7', 2, $2, $3)`
	_, err := b.store.Pool().Exec(ctx, note, "timeline", int64(70), int64(10))
	require.NoError(t, err)
	_, err = b.store.Pool().Exec(ctx, note, "timeline", int64(72), int64(12)) // a second finder
	require.NoError(t, err)

	r = b.run(t, "status")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "warning: ")
	require.Contains(t, r.stdout, "the server changed (timeline: 7/1 → 7/2)")
	require.Contains(t, r.stdout, "positions 11 to 72 were handed out again")

	r = b.run(t, "status", "--failovers", "--json")
	require.Equal(t, exitOK, r.code, r.stderr)
	rec := decode[[]eventsource.RecordedServerChange](t, r.stdout)
	require.Len(t, rec, 1, "one failover, however many found it")
	require.EqualValues(t, 72, rec[0].HeadBefore)
	require.EqualValues(t, 10, rec[0].HeadAfter)
	require.Equal(t, 2, rec[0].Reports)

	r = b.run(t, "status", "--failovers", "-s", "balances")
	require.Equal(t, exitUsage, r.code)
}
