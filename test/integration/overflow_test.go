package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestSlowHandlerOverflow: a slow handler (-handler-delay) behind a reader
// queue of one batch (-queue-capacity 1) while a backlog is caught up and
// live appends go on: the publisher's batches overflow the queue (the
// default PauseAndResume policy drops them and the reader re-reads from
// the database), and still nothing is lost, nothing is duplicated and
// every stream is handled in order. The workers' metrics must show that
// the queue did overflow.
func TestSlowHandlerOverflow(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{
		Buckets: 4, Kind: leasestore.KindRow, HandlerDelay: 2 * time.Millisecond, QueueCapacity: 1,
	})
	backlog := pick(2000, 10000)
	appendBacklog(t, e, backlog, 100)
	e.startWorkers(2, startOpts{})
	e.startLoad(pick(200, 300), 100)
	time.Sleep(pick(5*time.Second, 30*time.Second))
	var overflows float64
	for _, slot := range []string{"w1", "w2"} {
		if p := e.c.current(slot); p != nil {
			overflows += scrapeMetric(p, "kumi_queue_overflows")
		}
	}
	r := e.finish("slow-handler-overflow", func(r *report) {
		r.extra = append(r.extra, fmt.Sprintf("backlog=%d queue_overflows=%v dead_letters=%d", backlog, overflows, e.o.deadLetters()))
	})
	requireSafe(t, r)
	if r.duplicates != 0 {
		t.Errorf("overflow recovery delivered %d events twice", r.duplicates)
	}
	if overflows == 0 {
		t.Errorf("the reader queues never overflowed: the scenario tested nothing")
	}
}

// appendBacklog appends n events over streams streams before any worker
// runs, in batches of ten per stream, and sequences them.
func appendBacklog(t *testing.T, e *env, n, streams int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, e.url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i += 10 {
		batch := make([]eventsource.EventData, 0, 10)
		for j := range min(10, n-i) {
			data, _ := json.Marshal(map[string]int{"n": i + j})
			batch = append(batch, eventsource.EventData{Type: "Backlogged", Data: data})
		}
		if _, err := store.Append(ctx, fmt.Sprintf("%s-%d", e.cfg.Category, (i/10)%streams), eventsource.Any, batch); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := store.Sequence(ctx); err != nil {
		t.Fatal(err)
	}
}

// scrapeMetric sums every sample of the metrics whose name starts with
// prefix on p's /metrics.
func scrapeMetric(p *proc, prefix string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := &http.Client{}
	defer c.CloseIdleConnections()
	v, _ := scrapeSum(ctx, c, "http://"+p.metricsAddr+"/metrics", prefix)
	return v
}
