package actors

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) {
	// The child process of BenchmarkLiveLatencyRemote: an appender, not tests.
	if spec := os.Getenv(latencyAppenderEnv); spec != "" {
		os.Exit(runLatencyAppender(spec))
	}
	pgtest.Main(m)
}

// startedRuntime is New, then Start bounded by ctx.
func startedRuntime(ctx context.Context, system *actor.ActorSystem, store *eventsource.Store, opts RuntimeOptions) (*Runtime, error) {
	rt, err := New(system, store, opts)
	if err != nil {
		return nil, err
	}
	if err := rt.Start(ctx); err != nil {
		return nil, err
	}
	return rt, nil
}

func quietSystem() *actor.ActorSystem {
	var h slog.Handler = slog.DiscardHandler
	if os.Getenv("KUMI_TEST_LOG") != "" {
		h = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(h) }))
}

func testLoggerOrDiscard() *slog.Logger {
	if l := testLogger(); l != nil {
		return l
	}
	return slog.New(slog.DiscardHandler)
}

func testLogger() *slog.Logger {
	if os.Getenv("KUMI_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return nil
}

// recorder is the sink of the test handlers: what was delivered, to whom,
// in which order, and any overlap of one stream between workers.
type recorder struct {
	mu         sync.Mutex
	count      map[uuid.UUID]int
	lastVer    map[string]int64
	active     map[string]string
	order      []string
	overlaps   []string
	total      int
	perWorker  map[string]int
	byPosition map[int64]int
}

func newRecorder() *recorder {
	return &recorder{count: map[uuid.UUID]int{}, lastVer: map[string]int64{}, active: map[string]string{},
		perWorker: map[string]int{}, byPosition: map[int64]int{}}
}

func (r *recorder) begin(worker string, e eventsource.RecordedEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w, ok := r.active[e.Stream]; ok && w != worker {
		r.overlaps = append(r.overlaps, fmt.Sprintf("%s handled by %s and %s at once", e.Stream, w, worker))
	}
	r.active[e.Stream] = worker
	if last, ok := r.lastVer[e.Stream]; ok && e.Version < last && r.count[e.ID] == 0 {
		r.order = append(r.order, fmt.Sprintf("%s: version %d after %d", e.Stream, e.Version, last))
	}
}

func (r *recorder) end(worker string, e eventsource.RecordedEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.active, e.Stream)
	r.count[e.ID]++
	r.total++
	r.perWorker[worker]++
	r.lastVer[e.Stream] = max(r.lastVer[e.Stream], e.Version)
}

func (r *recorder) distinct() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.count)
}

func (r *recorder) duplicates() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := 0
	for _, n := range r.count {
		d += n - 1
	}
	return d
}

// ackHandler acks every delivery after recording it.
func ackHandler(rec *recorder, worker string) *actor.Props {
	return actor.PropsFromFunc(func(ctx actor.Context) {
		if d, ok := ctx.Message().(*Delivery); ok {
			rec.begin(worker, d.Event)
			rec.end(worker, d.Event)
			ctx.Respond(Ack{})
		}
	})
}

// testWorker is one worker: its own actor system, pool and runtime.
type testWorker struct {
	name  string
	sys   *actor.ActorSystem
	pool  *pgxpool.Pool
	rt    *Runtime
	group *Group
}

func startWorker(t *testing.T, schema, name string, opts GroupOptions) *testWorker {
	t.Helper()
	return startWorkerOn(t, pgtest.NewPool(t, 12), schema, name, opts)
}

// startWorkerOn is startWorker on a pool of the caller's.
func startWorkerOn(t *testing.T, pool *pgxpool.Pool, schema, name string, opts GroupOptions) *testWorker {
	t.Helper()
	ctx := context.Background()
	w := &testWorker{name: name, sys: quietSystem(), pool: pool}
	store, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, store, RuntimeOptions{Logger: testLogger(), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	opts.Worker = name
	w.group, err = w.rt.StartGroup(ctx, opts)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	return w
}

// stop is the graceful stop.
func (w *testWorker) stop(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.rt.Stop(ctx))
}

// kill stops a worker without any graceful step: its actors stop, its
// connections close, and its leases stay in the table until they expire.
func (w *testWorker) kill(t testing.TB) {
	w.group.Abort()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.rt.Stop(ctx))
}

func (w *testWorker) owned() []int {
	w.group.g.mu.Lock()
	defer w.group.g.mu.Unlock()
	var out []int
	for b := range w.group.g.owned {
		out = append(out, b)
	}
	return out
}

// seed appends n events round-robin over streams of category.
func seed(t testing.TB, store *eventsource.Store, category string, streams, n int) {
	t.Helper()
	ctx := context.Background()
	for i := 0; i < n; i++ {
		_, err := store.Append(ctx, fmt.Sprintf("%s-%d", category, i%streams), eventsource.Any,
			[]eventsource.EventData{{Type: "Seeded", Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}})
		require.NoError(t, err)
	}
}

func newTestStore(t testing.TB) (*eventsource.Store, string) {
	t.Helper()
	schema := pgtest.NewSchema(t)
	s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s, schema
}
