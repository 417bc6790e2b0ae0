package leasestore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testBundle is one test's database: a fresh migrated schema and a
// subscription name, on the shared pool unless a test asks for its own.
type testBundle struct {
	pool   *pgxpool.Pool
	schema string
	sub    string
}

func setup(t *testing.T) *testBundle {
	t.Helper()
	ctx := context.Background()
	b := &testBundle{pool: pgtest.Pool(t), schema: pgtest.NewSchema(t), sub: "orders"}
	require.NoError(t, Migrate(ctx, b.pool, b.schema))
	return b
}

// config is a store config with short, test-sized times.
func (b *testBundle) config(kind Kind, n int, worker string) Config {
	return Config{
		Schema: b.schema, Subscription: b.sub, Worker: worker, Buckets: n, LeaseOptions: LeaseOptions{Kind: kind, TTL: 30 * time.Second},
		// long: tests that need expiry shorten it
	}
}

// open returns a store closed when the test ends.
func (b *testBundle) open(t *testing.T, cfg Config) *Store {
	t.Helper()
	return openOn(t, b.pool, cfg)
}

// testBatchers is, by pool, the batcher every store of the pool shares
// when the suite runs with KUMI_LEASE_BATCHED set: the whole suite then
// passes through PassBatcher, as the actors runtime's stores do.
var testBatchers sync.Map

// batcherFor returns pool's batcher, made on first use.
func batcherFor(pool *pgxpool.Pool) *PassBatcher {
	if b, ok := testBatchers.Load(pool); ok {
		return b.(*PassBatcher)
	}
	b, err := NewPassBatcher(pool, 5*time.Millisecond)
	if err != nil {
		panic(err)
	}
	got, _ := testBatchers.LoadOrStore(pool, b)
	return got.(*PassBatcher)
}

// testSessions is, by pool, schema, worker and session URL, the Sessions
// every KindSession store of that worker shares when the suite runs with
// KUMI_LEASE_SHARED_SESSIONS set: each worker id of a test is then one
// process, whose stores hold their locks on one connection, as the actors
// runtime's groups do.
var testSessions sync.Map

type sessionsKey struct {
	pool                   *pgxpool.Pool
	schema, worker, source string
}

// sessionsFor returns the worker's Sessions, made on first use.
func sessionsFor(pool *pgxpool.Pool, cfg Config) (*Sessions, error) {
	k := sessionsKey{pool, cfg.Schema, cfg.Worker, cfg.SessionURL}
	if s, ok := testSessions.Load(k); ok {
		return s.(*Sessions), nil
	}
	s, err := NewSessions(pool, cfg.Schema, cfg.SessionURL)
	if err != nil {
		return nil, err
	}
	got, _ := testSessions.LoadOrStore(k, s)
	return got.(*Sessions), nil
}

// sharedSessions reports that the suite runs with shared sessions
// (KUMI_LEASE_SHARED_SESSIONS).
func sharedSessions() bool { return os.Getenv("KUMI_LEASE_SHARED_SESSIONS") != "" }

// startedStore is New, then Start bounded by ctx (with a batcher shared by
// the pool's stores when KUMI_LEASE_BATCHED is set, and a Sessions shared
// by a named worker's KindSession stores when KUMI_LEASE_SHARED_SESSIONS
// is).
func startedStore(ctx context.Context, pool *pgxpool.Pool, cfg Config) (*Store, error) {
	if cfg.Batcher == nil && os.Getenv("KUMI_LEASE_BATCHED") != "" {
		cfg.Batcher = batcherFor(pool)
	}
	if cfg.Sessions == nil && cfg.Kind == KindSession && cfg.Worker != "" && sharedSessions() {
		ss, err := sessionsFor(pool, cfg)
		if err != nil {
			return nil, err
		}
		cfg.Sessions = ss
	}
	s, err := New(pool, cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

func openOn(t *testing.T, pool *pgxpool.Pool, cfg Config) *Store {
	t.Helper()
	s, err := startedStore(context.Background(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

func pass(t *testing.T, s *Store) PassResult {
	t.Helper()
	res, err := passPatiently(t, s)
	require.NoError(t, err, "pass of %s", s.Worker())
	return res
}

// passPatiently runs a pass, and runs it again, for up to 30 s, while it is
// abandoned after one heartbeat: on a loaded machine (the race detector,
// the other packages' tests, 2 cores) a pass can outlast even a long
// heartbeat, and an abandoned pass changed nothing, so the next one is
// what the runtime would run. Any other error is returned at once.
func passPatiently(t testing.TB, s *Store) (PassResult, error) {
	deadline := time.Now().Add(30 * time.Second)
	for {
		res, err := s.Pass(context.Background())
		if err == nil || !errors.Is(err, context.DeadlineExceeded) || time.Now().After(deadline) {
			return res, err
		}
		t.Logf("the pass of %s was abandoned after one heartbeat (%v); passing again", s.Worker(), err)
	}
}

// lapse expires worker's row, as its TTL would once it stopped
// heartbeating: a dead worker, without a race between the test's next
// steps and a short TTL.
func (b *testBundle) lapse(t *testing.T, worker string) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), "UPDATE "+pgx.Identifier{b.schema, "lease_workers"}.Sanitize()+
		" SET expires_at = now() - interval '1 second' WHERE subscription = $1 AND worker = $2", b.sub, worker)
	require.NoError(t, err)
}

// eventually polls cond for up to timeout (pgtest.WaitFor) and, if it
// never holds, fails with what observed tells, evaluated after the wait:
// the state the test gave up on.
func eventually(t testing.TB, timeout time.Duration, cond func() bool, observed func() string) {
	t.Helper()
	if !pgtest.WaitFor(timeout, cond) {
		t.Fatalf("condition not met within %v: %s", timeout, observed())
	}
}

func buckets(ls []Lease) []int {
	out := make([]int, len(ls))
	for i, l := range ls {
		out[i] = l.Bucket
	}
	return out
}

func seq(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// round runs one pass of every store concurrently, then hands over every
// bucket a pass asked to (as a coordinator whose readers drain at once).
func round(t *testing.T, stores []*Store) []PassResult {
	t.Helper()
	res := make([]PassResult, len(stores))
	errs := make([]error, len(stores))
	var wg sync.WaitGroup
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = passPatiently(t, s)
			for _, b := range res[i].HandOff {
				if errs[i] == nil {
					errs[i] = s.HandOver(context.Background(), b)
				}
			}
		}()
	}
	wg.Wait()
	for i, err := range errs {
		require.NoError(t, err, "worker %d", i)
	}
	return res
}

// ownership reads who owns what, by the database's clock.
func ownership(t *testing.T, s *Store) (owner map[int]string, perWorker map[string][]int) {
	t.Helper()
	snap, err := s.Snapshot(context.Background())
	require.NoError(t, err)
	owner, perWorker = map[int]string{}, map[string][]int{}
	for _, b := range snap.Buckets {
		if b.Held(snap.Now) {
			owner[b.Bucket] = b.Owner
			perWorker[b.Owner] = append(perWorker[b.Owner], b.Bucket)
		}
	}
	return owner, perWorker
}

func describe(perWorker map[string][]int) string {
	var ws []string
	for w := range perWorker {
		ws = append(ws, w)
	}
	sort.Strings(ws)
	out := ""
	for _, w := range ws {
		out += fmt.Sprintf("%s:%d ", w, len(perWorker[w]))
	}
	return out
}
