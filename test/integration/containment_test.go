package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestSlowExactlyOnce: exactly-once workers (-exactly-once) whose
// transaction, on the first attempt at every seventh event, stays open
// twice as long as HandlerTimeout after its write, deaf to the delivery's
// cancellation; the reader gives up on the handler, replaces it and
// retries while the first attempt has yet to commit. One worker is killed
// with SIGKILL midway. The effect — the sink row, whose deliveries count
// every commit — must land once per event: duplicates 0.
func TestSlowExactlyOnce(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{
		Buckets: 8, Kind: leasestore.KindRow, Exactly: true,
		Extra: []string{"-handler-timeout", "300ms", "-slow-tx", "600ms", "-slow-tx-every", "7"},
	})
	e.startWorkers(2, startOpts{})
	e.startLoad(pick(100, 200), 50)
	time.Sleep(pick(4*time.Second, 20*time.Second))
	p := e.c.current("w1")
	at := time.Now()
	e.c.kill(p)
	e.faults = append(e.faults, fault{worker: p.id, at: at})
	e.join("w1", startOpts{})
	time.Sleep(pick(4*time.Second, 20*time.Second))
	var hung int
	r := e.finish("slow-exactly-once", func(r *report) {
		hung = e.c.countLogLines(msgHandlerHung)
		r.extra = append(r.extra, fmt.Sprintf("handlers_replaced_hung=%d dead_letters=%d", hung, e.o.deadLetters()))
	})
	requireSafe(t, r)
	if r.duplicates != 0 {
		t.Errorf("%d effects committed twice", r.duplicates)
	}
	if hung == 0 {
		t.Errorf("no handler was given up on: the scenario tested nothing")
	}
}

// TestOverflowQuietTail: bursts of five appends to one stream (so to one
// bucket), 40 ms apart, each its own transaction and so its own batch,
// into reader queues of one batch (-queue-capacity 1, -batch-size 2)
// behind a 300 ms handler, each burst followed by quiet. The reader holds
// the second and third event, the queue the fourth, and the fifth
// overflows it: the batches the overflow drops are the last of their
// burst, and no later batch comes to reveal the gap. Every event must
// reach the sink with no further append: lost 0, duplicates 0.
func TestOverflowQuietTail(t *testing.T) {
	for _, policy := range []string{"pause_and_resume", "drop_subscription"} {
		t.Run(policy, func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{
				Buckets: 4, Kind: leasestore.KindRow, HandlerDelay: 300 * time.Millisecond, QueueCapacity: 1,
				Extra: []string{"-batch-size", "2", "-overflow", policy},
			})
			e.startWorkers(2, startOpts{})
			store, closeStore := e.appender()
			defer closeStore()
			ctx := context.Background()
			tick := time.NewTicker(40 * time.Millisecond)
			defer tick.Stop()
			for b := range pick(8, 40) {
				for i := range 5 {
					<-tick.C
					data, _ := json.Marshal(map[string]int{"burst": b, "n": i})
					if _, err := store.Append(ctx, fmt.Sprintf("%s-%d", e.cfg.Category, b%16), eventsource.Any,
						[]eventsource.EventData{{Type: "Burst", Data: data}}); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(time.Second) // the quiet tail
			}
			var overflows float64
			for _, slot := range []string{"w1", "w2"} {
				if p := e.c.current(slot); p != nil {
					overflows += scrapeMetric(p, "kumi_queue_overflows")
				}
			}
			r := e.finish("overflow-quiet-tail", func(r *report) {
				r.extra = append(r.extra, fmt.Sprintf("policy=%s queue_overflows=%v", policy, overflows))
			})
			requireSafe(t, r)
			if r.duplicates != 0 {
				t.Errorf("%d events delivered twice", r.duplicates)
			}
			if overflows == 0 {
				t.Errorf("the reader queues never overflowed: the scenario tested nothing")
			}
		})
	}
}

// TestPoisonAndHungHandlers: among healthy streams under steady appends,
// poison events (the handler panics on every attempt: three of them spend
// a handler's restart budget) and hanging ones (the handler blocks, deaf
// to its context, until the worker stops) go to their own streams of the
// same category, so to the same buckets. Each costs its own retries and
// dead letter, nothing else: healthy events lost 0 and none dead-lettered.
func TestPoisonAndHungHandlers(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{
		Buckets: 4, Kind: leasestore.KindRow,
		Extra: []string{"-handler-timeout", "500ms", "-max-attempts", "3", "-poison-type", "Poison", "-hang-type", "Hang"},
	})
	e.startWorkers(2, startOpts{})
	e.startLoad(pick(100, 200), 50)
	store, closeStore := e.appender()
	defer closeStore()
	ctx := context.Background()
	bad := 0
	end := time.Now().Add(pick(6*time.Second, 40*time.Second))
	for i := 0; time.Now().Before(end); i++ {
		typ := "Poison"
		if i%2 == 1 {
			typ = "Hang"
		}
		if _, err := store.Append(ctx, fmt.Sprintf("%s-bad%d", e.cfg.Category, i%8), eventsource.Any,
			[]eventsource.EventData{{Type: typ, Data: []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
		bad++
		time.Sleep(300 * time.Millisecond)
	}
	e.load.stop()

	// Healthy events reach the sink, bad ones the dead letters.
	q := fmt.Sprintf(`SELECT
		count(*) FILTER (WHERE e.type NOT IN ('Poison', 'Hang') AND NOT EXISTS (
			SELECT 1 FROM %[1]s.sink s WHERE s.subscription = $2 AND s.event_id = e.event_id)),
		count(*) FILTER (WHERE e.type IN ('Poison', 'Hang') AND NOT EXISTS (
			SELECT 1 FROM %[1]s.dead_letters d WHERE d.subscription = $2 AND d.event_id = e.event_id)),
		count(*) FILTER (WHERE e.type NOT IN ('Poison', 'Hang') AND EXISTS (
			SELECT 1 FROM %[1]s.dead_letters d WHERE d.subscription = $2 AND d.event_id = e.event_id)),
		count(*) FILTER (WHERE e.position IS NULL)
		FROM %[2]s e WHERE e.category = $1`, e.o.q, eventsWithPositions(e.o.q))
	var healthyLost, badPending, healthyDead, unsequenced int64
	deadline := time.Now().Add(pick(90*time.Second, 180*time.Second))
	for {
		err := e.o.pool.QueryRow(ctx, q, e.o.cat, e.o.sub).Scan(&healthyLost, &badPending, &healthyDead, &unsequenced)
		if err == nil && healthyLost == 0 && badPending == 0 && unsequenced == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("not settled: %d healthy events not in the sink, %d bad events not dead-lettered (err %v)", healthyLost, badPending, err)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r := e.o.collect("poison-and-hung-handlers", e.cfg.Kind.String(), e.faults)
	r.lost = healthyLost // the bad events are dead letters by design
	r.extra = append(r.extra, fmt.Sprintf("bad_events=%d dead_letters=%d healthy_dead_letters=%d handlers_replaced_hung=%d append_errors=%d",
		bad, e.o.deadLetters(), healthyDead, e.c.countLogLines(msgHandlerHung), e.load.failed.Load()))
	fmt.Println(r.line())
	e.c.stopAll()
	e.c.checkProcesses()
	requireSafe(t, r)
	if healthyDead != 0 {
		t.Errorf("%d healthy events dead-lettered", healthyDead)
	}
	if n := e.o.deadLetters(); n != int64(bad) {
		t.Errorf("%d dead letters for %d bad events", n, bad)
	}
}

// msgHandlerHung is the Warn log of a reader that gives up on its handler.
const msgHandlerHung = "kumi: handler hung; replacing it"

// countLogLines counts the lines of every worker's log containing s.
func (c *cluster) countLogLines(s string) int {
	c.mu.Lock()
	all := append([]*proc(nil), c.all...)
	c.mu.Unlock()
	n := 0
	for _, p := range all {
		b, err := os.ReadFile(p.logPath)
		if err == nil {
			n += strings.Count(string(b), s)
		}
	}
	return n
}

// appender returns a store on a pool of its own for a scenario's own
// appends (the workers' sequencers sequence them) and its closer.
func (e *env) appender() (*eventsource.Store, func()) {
	e.t.Helper()
	pool, err := pgxpool.New(context.Background(), withAppName(e.url, "appender"))
	if err != nil {
		e.t.Fatal(err)
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		pool.Close()
		e.t.Fatal(err)
	}
	return store, pool.Close
}
