package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// demoBin is the demo under test, built once by TestMain.
var demoBin string

func TestMain(m *testing.M) {
	bin, err := pgtest.BuildBinary("github.com/kumi-run/kumi/cmd/demo", "demo")
	if err != nil {
		fmt.Fprintln(os.Stderr, "demo tests: build the binary:", err)
		os.Exit(2)
	}
	demoBin = bin
	pgtest.Main(m)
}

type result struct {
	code           int
	stdout, stderr string
}

// runDemoBin runs the demo binary with env added to an environment without
// DATABASE_URL.
func runDemoBin(t *testing.T, timeout time.Duration, env []string, args ...string) result {
	t.Helper()
	return runDemoBinWatching(t, timeout, env, nil, args...)
}

// runDemoBinWatching is runDemoBin that, while the demo runs, hands watch
// (when not nil, on the test's goroutine) the lines of the demo's stdout as
// they come; lines it does not take in time are only collected.
func runDemoBinWatching(t *testing.T, timeout time.Duration, env []string, watch func(lines <-chan string), args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, demoBin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "OTEL_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	var out strings.Builder
	var errb bytes.Buffer
	cmd.Stderr = &errb
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 1024)
	copied := make(chan struct{})
	go func() { // out is read only after copied is closed
		defer close(copied)
		defer close(lines)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			out.WriteString(line)
			select {
			case lines <- strings.TrimSuffix(line, "\n"):
			default:
			}
			if err != nil {
				return
			}
		}
	}()
	if watch != nil {
		watch(lines)
	}
	<-copied
	err = cmd.Wait()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("run demo %v: %v", args, err)
	}
	require.NoError(t, ctx.Err(), "the demo did not end within %v:\n%s\n%s", timeout, r.stdout, r.stderr)
	require.NotContains(t, r.stdout+r.stderr, "DATA RACE")
	return r
}

// consoleURL reads the demo's first lines up to the one that gives the web
// console's address, and returns it.
func consoleURL(t *testing.T, lines <-chan string) string {
	t.Helper()
	var head []string
	for line := range lines {
		head = append(head, line)
		if u, ok := strings.CutPrefix(line, "console:  "); ok {
			require.LessOrEqual(t, len(head), 4, "the console's address is among the first lines: %q", head)
			return u
		}
	}
	t.Fatalf("the demo never printed the console's address: %q", head)
	return ""
}

// checkConsole asks the console, while the demo runs, for the demo
// subscription's page and its state: the buckets the workers hold.
func checkConsole(t *testing.T, page string, buckets int) {
	t.Helper()
	u, err := url.Parse(page)
	require.NoError(t, err)
	ip := net.ParseIP(u.Hostname())
	require.True(t, ip != nil && ip.IsLoopback(), "the console listens on loopback: %s", page)
	resp, err := http.Get(page)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), `data-sub="`+subscription+`"`)
	api := u.JoinPath("../../api/s", subscription).String()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		resp, err := http.Get(api)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var st struct { // the fields of /api/s/{sub} this test reads (docs/console.md)
			Buckets     int               `json:"bucket_count"`
			Category    string            `json:"category"`
			LiveWorkers int               `json:"live_workers"`
			Rows        []json.RawMessage `json:"buckets"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
		return st.Buckets == buckets && st.Category == category && len(st.Rows) == buckets && st.LiveWorkers > 0
	}, "the console shows the demo's %d buckets and its live workers", buckets)
}

var checkLine = regexp.MustCompile(`(?m)^check: appended (\d+), handled (\d+) distinct, (\d+) deliveries`)

// The end-to-end run of issue 6: real worker processes, a join, a resize
// from 8 to 16 buckets (issue 14), a graceful leave and a kill -9 in a few
// seconds, and nothing lost.
func TestShortRunLosesNothing(t *testing.T) {
	t.Parallel()
	// With -exactly-once the check also requires no duplicate: the kill
	// and the resize's switch included.
	runs := []struct {
		name    string
		kind    string
		exactly bool
	}{{"row", "row", false}, {"session", "session", false}, {"session-exactly-once", "session", true}}
	if testing.Short() {
		runs = runs[:1]
	}
	for _, run := range runs {
		t.Run(run.name, func(t *testing.T) {
			t.Parallel()
			args := []string{"-short", "-no-tui", "-v", "-lease", run.kind}
			traces := filepath.Join(t.TempDir(), "traces.jsonl")
			if run.name == "row" {
				args = append(args, "-traces", traces) // every process appends its spans there
			}
			if run.exactly {
				args = append(args, "-exactly-once")
			}
			// The console shows the run while it runs (issue 15).
			r := runDemoBinWatching(t, 3*time.Minute, []string{"DATABASE_URL=" + pgtest.URL(t)},
				func(lines <-chan string) { checkConsole(t, consoleURL(t, lines), 8) }, args...)
			out := r.stdout + r.stderr
			require.Equal(t, exitOK, r.code, out)
			for _, want := range []string{
				" join ", "w3 started",
				" resize ", "8 → 16 buckets requested (generation 0 → 1)",
				"done: generation 1 serves with 16 buckets",
				" leave ", "sent SIGTERM", " left ", "stopped gracefully",
				" kill ", "killed with SIGKILL", " gone ",
				" took ",
				"— nothing lost",
			} {
				require.Contains(t, r.stdout, want)
			}
			m := checkLine.FindStringSubmatch(r.stdout)
			require.NotNil(t, m, r.stdout)
			appended, _ := strconv.Atoi(m[1])
			handled, _ := strconv.Atoi(m[2])
			require.Greater(t, appended, 100, "the producer ran")
			require.Equal(t, appended, handled, "every appended event handled")
			if run.exactly {
				deliveries, _ := strconv.Atoi(m[3])
				require.Equal(t, handled, deliveries, "no duplicate with -exactly-once")
			}
			if run.name == "row" {
				require.Contains(t, r.stdout, "traces:   appended to "+traces)
				raw, err := os.ReadFile(traces)
				require.NoError(t, err)
				for _, want := range []string{`"Name":"kumi.lease.claim"`, `"Name":"kumi.lease.handoff`, "kumi-demo-worker"} {
					require.Contains(t, string(raw), want, "the spans of every worker, without Jaeger")
				}
			}
			// The demo's schema in DATABASE_URL is dropped on exit.
			schema := regexp.MustCompile(`schema "(kumi_demo_[0-9a-f]+)"`).FindStringSubmatch(r.stdout)
			require.NotNil(t, schema, r.stdout)
			var n int
			require.NoError(t, pgtest.Pool(t).QueryRow(context.Background(),
				`SELECT count(*) FROM pg_namespace WHERE nspname = $1`, schema[1]).Scan(&n))
			require.Zero(t, n, "schema %s left behind", schema[1])
		})
	}
}

func TestBadFlagsExitTwo(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ args, want string }{
		{"-workers 0", "-workers 0: use 1 to 32"},
		{"-lease lock", `-lease "lock": use row or session`},
		{"-rate -1", "-rate -1"},
		{"-bogus", "flag provided but not defined: -bogus"},
		{"extra", `unexpected argument "extra"`},
		{"-console 7070", `-console "7070": use HOST:PORT (127.0.0.1:0 picks a free loopback port) or off`},
		// The demo's console has no token: beyond loopback it would be
		// anyone's, dead letters and event data included.
		{"-console 0.0.0.0:0", "-console 0.0.0.0:0: the demo's console has no token, so it serves on loopback only"},
		{"-console :0", "serves on loopback only"},
	} {
		t.Run(c.args, func(t *testing.T) {
			t.Parallel()
			r := runDemoBin(t, time.Minute, nil, strings.Fields(c.args)...)
			require.Equal(t, exitUsage, r.code, r.stderr)
			require.Contains(t, r.stderr, c.want)
		})
	}
	t.Run("HelpExitsZero", func(t *testing.T) {
		t.Parallel()
		r := runDemoBin(t, time.Minute, nil, "-h")
		require.Equal(t, exitOK, r.code)
		require.Contains(t, r.stderr, "-short")
	})
}

func TestDatabaseErrors(t *testing.T) {
	t.Parallel()
	t.Run("BadURLNeverShowsThePassword", func(t *testing.T) {
		t.Parallel()
		r := runDemoBin(t, time.Minute, []string{"DATABASE_URL=postgres://admin:hunter2@127.0.0.1:notaport/db"}, "-short")
		require.Equal(t, exitFail, r.code)
		require.Contains(t, r.stderr, "DATABASE_URL: the database URL is not a valid PostgreSQL connection string")
		require.NotContains(t, r.stdout+r.stderr, "hunter2")
		// A '/' in the password: the demo and its worker processes.
		slash := []string{"DATABASE_URL=postgres://kumi:s3cr3tPrefix/Tail@127.0.0.1/db"}
		r = runDemoBin(t, time.Minute, slash, "-short")
		require.Equal(t, exitFail, r.code)
		require.NotContains(t, r.stdout+r.stderr, "s3cr3tPrefix")
		r = runDemoBin(t, time.Minute, slash, "worker", "-buckets", "4")
		require.Equal(t, exitFail, r.code, r.stderr)
		require.Contains(t, r.stderr, "%2F")
		require.NotContains(t, r.stdout+r.stderr, "s3cr3tPrefix")
	})
	t.Run("UnreachableDatabaseNeverShowsThePassword", func(t *testing.T) {
		t.Parallel()
		port, err := pgtest.FreePort()
		require.NoError(t, err)
		r := runDemoBin(t, time.Minute, []string{fmt.Sprintf(
			"DATABASE_URL=postgres://admin:hunter2@127.0.0.1:%d/db?connect_timeout=5", port)}, "-short")
		require.Equal(t, exitFail, r.code)
		require.Contains(t, r.stderr, "DATABASE_URL: cannot connect to the database")
		require.NotContains(t, r.stdout+r.stderr, "hunter2")
	})
	t.Run("EmbeddedPortInUse", func(t *testing.T) {
		t.Parallel()
		_, err := pgtest.FindBinaries()
		require.NoError(t, err, "this test starts the embedded server: it needs the local server binaries")
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		port := ln.Addr().(*net.TCPAddr).Port
		r := runDemoBin(t, 2*time.Minute, nil, "-short", "-pg-port", strconv.Itoa(port))
		require.Equal(t, exitFail, r.code, r.stdout)
		require.Contains(t, r.stderr, fmt.Sprintf("port %d is in use", port))
		require.Contains(t, r.stderr, "-pg-port 0")
	})
	t.Run("PgPortWithDatabaseURLIsRefused", func(t *testing.T) {
		t.Parallel()
		r := runDemoBin(t, time.Minute, []string{"DATABASE_URL=" + pgtest.URL(t)}, "-pg-port", "5999")
		require.Equal(t, exitFail, r.code)
		require.Contains(t, r.stderr, "-pg-port is for the embedded PostgreSQL")
	})
}

// The check itself: a missing sink row fails it, a duplicate is reported,
// and with -exactly-once a duplicate fails it too.
func TestCheckCountsFromTheDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	db := &database{schema: schema, pool: pgtest.Pool(t), store: store}
	require.NoError(t, db.migrate(ctx))
	var ids []string
	for i := range 3 {
		res, err := store.Append(ctx, fmt.Sprintf("account-%d", i), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(`{}`)}})
		require.NoError(t, err)
		ids = append(ids, res.IDs[0].String())
	}
	_, err = store.Append(ctx, "other-1", eventsource.Any, []eventsource.EventData{{Type: "X", Data: []byte(`{}`)}})
	require.NoError(t, err)
	_, err = store.Sequence(ctx)
	require.NoError(t, err)
	sink := func(id string, deliveries int) {
		_, err := db.pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{schema}.Sanitize()+
			`.sink (subscription, event_id, position, stream, version, worker, deliveries) VALUES ('demo', $1, 0, 's-1', 0, 'w1', $2)`,
			id, deliveries)
		require.NoError(t, err)
	}
	sink(ids[0], 1)
	sink(ids[1], 2)

	tl, err := count(ctx, db, subscription, category)
	require.NoError(t, err)
	require.Equal(t, tally{Appended: 3, Handled: 2, Deliveries: 3, Missing: 1}, tl)
	line, ok := tl.verdict(false)
	require.False(t, ok)
	require.Contains(t, line, "FAILED: 1 events were not handled")

	sink(ids[2], 1)
	tl, err = count(ctx, db, subscription, category)
	require.NoError(t, err)
	line, ok = tl.verdict(false)
	require.True(t, ok, line)
	require.Equal(t, "check: appended 3, handled 3 distinct, 4 deliveries (1 duplicates: at-least-once redelivery after the kill, see docs/guarantees.md) — nothing lost", line)
	line, ok = tl.verdict(true)
	require.False(t, ok, line)
	require.Contains(t, line, "duplicates despite -exactly-once")
}

func TestInspectReadsWithoutJoining(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	_, err = inspect.Inspect(ctx, store, "demo", "")
	require.ErrorIs(t, err, inspect.ErrNotMigrated)
	db := &database{schema: schema, pool: pgtest.Pool(t), store: store}
	require.NoError(t, db.migrate(ctx))
	in, err := inspect.Inspect(ctx, store, "demo", category)
	require.NoError(t, err)
	require.Empty(t, in.Rows)
	require.Empty(t, in.Workers)
}

func TestShortChangesOnlyTheDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseFlags([]string{"-short", "-workers", "4"}, &bytes.Buffer{})
	require.NoError(t, err)
	require.Equal(t, 4, c.workers)
	require.Equal(t, 8, c.buckets)
	require.Equal(t, 6*time.Second, c.duration)
	require.Equal(t, 1500*time.Millisecond, c.ttl)
	require.Less(t, 3*c.heartbeat()+c.margin(), c.ttl)
}

func TestTruncateKeepsEscapes(t *testing.T) {
	t.Parallel()
	s := "\x1b[1mbold\x1b[0m and ✗ more"
	require.Equal(t, "\x1b[1mbold\x1b[0m a\x1b[0m", truncate(s, 6))
	require.Equal(t, s, truncate(s, 100))
	require.Equal(t, "ab✗\x1b[0m", truncate("ab✗cd", 3))
}

// No usage text, error or log line of the demo or its worker subcommand
// shows a password: `demo worker -h` printed DATABASE_URL as a flag
// default (issue 15).
func TestNoOutputShowsThePassword(t *testing.T) {
	t.Parallel()
	port, err := pgtest.FreePort()
	require.NoError(t, err)
	env := []string{fmt.Sprintf("DATABASE_URL=postgres://admin:hunter2@127.0.0.1:%d/db?connect_timeout=5", port)}
	for _, args := range [][]string{
		{"-h"}, {"-bogus"}, {"-workers", "0"}, {"extra"}, {"-short"},
		{"worker", "-h"}, {"worker", "-bogus"}, {"worker", "-lease", "lock"}, {"worker", "extra"},
		{"worker", "-buckets", "4"}, // cannot connect
	} {
		r := runDemoBin(t, time.Minute, env, args...)
		require.NotContains(t, r.stdout+r.stderr, "hunter2", "demo %q", args)
		if args[0] == "worker" && args[1] == "-h" {
			require.Contains(t, r.stderr, "-database-url", "the usage text")
		}
	}
}
