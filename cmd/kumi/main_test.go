package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// kumiBin is the CLI under test, built once by TestMain.
var kumiBin string

func TestMain(m *testing.M) {
	bin, err := pgtest.BuildBinary("github.com/kumi-run/kumi/cmd/kumi", "kumi")
	if err != nil {
		fmt.Fprintln(os.Stderr, "kumi tests: build the binary:", err)
		os.Exit(2)
	}
	kumiBin = bin
	pgtest.Main(m)
}

// result is one run of the binary.
type result struct {
	code           int
	stdout, stderr string
}

// kumi runs the binary with args; env entries replace the environment's
// DATABASE_URL and KUMI_SCHEMA, which are otherwise removed.
func kumi(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, kumiBin, args...)
	cmd.Env = cleanEnv(env)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("run kumi %v: %v", args, err)
	}
	require.NotContains(t, r.stderr, "DATA RACE", "kumi %v", args)
	return r
}

func cleanEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "KUMI_SCHEMA=") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// bundle is one test's database: a fresh schema, migrated, and a store.
type bundle struct {
	env    []string // DATABASE_URL and KUMI_SCHEMA for the binary
	schema string
	store  *eventsource.Store
}

// setup migrates a schema of its own on the test server.
func setup(t *testing.T) *bundle {
	t.Helper()
	return setupOn(t, pgtest.URL(t), pgtest.Pool(t))
}

// setupOn migrates a schema of its own on the server at url, which pool
// reaches.
func setupOn(t *testing.T, url string, pool *pgxpool.Pool) *bundle {
	t.Helper()
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, leasestore.Migrate(ctx, store.Pool(), schema))
	return &bundle{env: []string{"DATABASE_URL=" + url, "KUMI_SCHEMA=" + schema}, schema: schema, store: store}
}

// setupStandby is setup on a server of this machine with a hot standby of
// it (pgtest.LocalServer, pgtest.NewReplica); fill runs on the primary
// before the standby starts, which has replayed all of it on return.
func setupStandby(t *testing.T, fill func(b *bundle, primaryURL string)) (*bundle, *pgtest.Replica) {
	t.Helper()
	srv := pgtest.LocalServer(t)
	b := setupOn(t, srv.URL, pgtest.PoolOn(t, srv.URL, 4))
	fill(b, srv.URL)
	// One base backup of the server at a time: pg_basebackup creates its
	// replication slot only after the backup's checkpoint, and another
	// backup's checkpoint in between can remove the WAL it starts from
	// ("requested WAL segment ... has already been removed").
	backups.Lock()
	defer backups.Unlock()
	r := pgtest.NewReplica(t, srv)
	require.NoError(t, r.WaitReplayed(context.Background()))
	return b, r
}

// backups serializes setupStandby's base backups.
var backups sync.Mutex

// pauseReplay pauses r's replay until the test ends: what the primary
// writes next, r does not show.
func pauseReplay(t *testing.T, r *pgtest.Replica) {
	t.Helper()
	require.NoError(t, r.PauseReplay(context.Background()))
	t.Cleanup(func() { _ = r.ResumeReplay(context.Background()) })
}

// run runs the binary against the bundle's schema.
func (b *bundle) run(t *testing.T, args ...string) result {
	t.Helper()
	return kumi(t, b.env, args...)
}

// appendEvents appends n events to category's streams (round robin over
// streams of them) and sequences them; it returns them as recorded (the
// category's last n).
func (b *bundle) appendEvents(t *testing.T, category string, streams, n int) []eventsource.RecordedEvent {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		_, err := b.store.Append(ctx, fmt.Sprintf("%s-%d", category, i%streams), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}})
		require.NoError(t, err)
	}
	_, err := b.store.Sequence(ctx)
	require.NoError(t, err)
	evs, err := b.store.ReadCategory(ctx, category, 0, 10_000)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(evs), n)
	return evs[len(evs)-n:]
}

// lease creates a worker's lease store (it joins the pool at once) and
// closes it at the end of the test.
// lease joins subscription as worker with one pass's worth of leases that
// outlive the test: the tests run a pass once and then read what it left,
// with no heartbeat after it, so a lease must not lapse while parallel
// tests wait for their turn (a 30 s default lapsed on a loaded machine and
// TestStatus saw 0 held buckets).
func (b *bundle) lease(t *testing.T, subscription, worker string, buckets int) *leasestore.Store {
	t.Helper()
	s, err := leasestore.New(b.store.Pool(), leasestore.Config{
		Schema: b.schema, Subscription: subscription, Worker: worker, Buckets: buckets, LeaseOptions: leasestore.LeaseOptions{NoListen: true, TTL: time.Hour},
	})
	if err == nil {
		err = s.Start(context.Background())
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}
