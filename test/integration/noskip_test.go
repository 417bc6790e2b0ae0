package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestNoSkipEndToEnd: the no-skip property through the whole pipeline.
// Concurrent appenders run transactions of one to three AppendTx calls with
// random delays inside, and roll a fifth of them back, so that commits
// land out of the order their rows were inserted in; two worker processes
// handle the category. Every committed event must reach the sink exactly
// once, in per-stream order, and no rolled-back one may.
func TestNoSkipEndToEnd(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 8, Kind: leasestore.KindRow})
	e.startWorkers(2, startOpts{})
	runNoSkip(t, e, "no-skip-end-to-end", pgtest.URL(t))
}

// runNoSkip is the no-skip scenario on e's running workers, its appenders
// connecting to appendURL.
func runNoSkip(t *testing.T, e *env, scenario, appendURL string) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pcfg, err := pgxpool.ParseConfig(appendURL)
	if err != nil {
		t.Fatal(err)
	}
	pcfg.MaxConns = 12
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	seq := eventsource.NewSequencer(store, eventsource.SequencerOptions{})
	if err := seq.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = seq.Stop(context.Background()) }()

	target := int64(pick(3000, 30000))
	const appenders, streams, rollbackPct = 8, 100, 20
	var mu sync.Mutex
	committed := map[uuid.UUID]streamVersion{}
	rolledBack := map[uuid.UUID]bool{}
	var total atomic.Int64
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), uint64(time.Now().UnixNano())))
			for total.Load() < target && ctx.Err() == nil {
				got, rollback, err := appendTxRandom(ctx, store, rng, streams, rollbackPct)
				if err != nil {
					t.Errorf("appender %d: %v", a, err)
					return
				}
				mu.Lock()
				for id, sv := range got {
					if rollback {
						rolledBack[id] = true
					} else {
						committed[id] = sv
					}
				}
				mu.Unlock()
				if !rollback {
					total.Add(int64(len(got)))
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	r := e.finish(scenario, func(r *report) {
		rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT event_id, stream, version, deliveries FROM %s.sink WHERE subscription = $1`,
			pgx.Identifier{e.cfg.Schema}.Sanitize()), e.cfg.Subscription)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uuid.UUID]bool{}
		var id uuid.UUID
		var stream string
		var version int64
		var deliveries int
		var wrong, phantom, twice int
		_, err = pgx.ForEachRow(rows, []any{&id, &stream, &version, &deliveries}, func() error {
			seen[id] = true
			sv, ok := committed[id]
			switch {
			case rolledBack[id] || !ok:
				phantom++
			case sv.stream != stream || sv.version != version:
				wrong++
			}
			if deliveries != 1 {
				twice++
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		missing := 0
		for id := range committed {
			if !seen[id] {
				missing++
			}
		}
		r.extra = append(r.extra, fmt.Sprintf("committed=%d rolled_back=%d missing=%d phantom=%d redelivered=%d",
			len(committed), len(rolledBack), missing, phantom, twice))
		if missing+phantom+wrong+twice > 0 {
			t.Errorf("committed %d: %d missing from the sink, %d rolled back or unknown in it, %d with the wrong stream or version, %d delivered more than once",
				len(committed), missing, phantom, wrong, twice)
		}
	})
	requireSafe(t, r)
	if r.appended != int64(len(committed)) {
		t.Errorf("the store holds %d events of the category, the appenders committed %d", r.appended, len(committed))
	}
	if len(rolledBack) == 0 {
		t.Errorf("no transaction was rolled back: the scenario tested less than it claims")
	}
}

type streamVersion struct {
	stream  string
	version int64
}

// appendTxRandom runs one transaction of one to three appends to distinct
// streams (in name order, so that two transactions never deadlock), with
// random delays between them, and commits it or (rollbackPct in 100) rolls
// it back.
func appendTxRandom(ctx context.Context, store *eventsource.Store, rng *rand.Rand, streams, rollbackPct int) (map[uuid.UUID]streamVersion, bool, error) {
	names := map[string]bool{}
	for range 1 + rng.IntN(3) {
		names[fmt.Sprintf("%s-%d", categoryName, rng.IntN(streams))] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	rollback := rng.IntN(100) < rollbackPct
	got := map[uuid.UUID]streamVersion{}
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, stream := range sorted {
		time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
		events := make([]eventsource.EventData, 1+rng.IntN(3))
		for i := range events {
			events[i] = eventsource.EventData{Type: "Moved", Data: []byte(`{}`)}
		}
		res, err := store.AppendTx(ctx, tx, stream, eventsource.Any, events)
		if err != nil {
			return nil, false, err
		}
		for i, id := range res.IDs {
			got[id] = streamVersion{stream: stream, version: res.FirstVersion + int64(i)}
		}
	}
	time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
	if rollback {
		return got, true, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, false, err
	}
	store.WakeSequencer()
	return got, false, nil
}
