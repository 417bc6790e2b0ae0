package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	runNoSkip(t, e, "no-skip-end-to-end", pgtest.URL(t), nil)
}

// runNoSkip is the no-skip scenario on e's running workers, its appenders
// connecting to appendURL. bouncer, when set, is the pooler on the way
// (pgtest's, started again after each crash); the scenario crashes it
// once a third of the events are appended. An append that fails because
// of a crash is not a fault of the scenario's: it was rolled back, or,
// when its COMMIT was under way, its outcome is read from the store at
// the end.
func runNoSkip(t *testing.T, e *env, scenario, appendURL string, bouncer *pgtest.Bouncer) {
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
	unsure := map[uuid.UUID]streamVersion{} // its COMMIT cut by a pooler's crash
	crashes := func() int64 { return 0 }
	if bouncer != nil {
		crashes = bouncer.Crashes
	}
	crashed := func(before int64, err error) bool {
		// The crash that cut the append is counted a moment after the
		// connection broke; an append begun while the bouncer was starting
		// again finds nothing listening; one begun after it may be given a
		// pooled connection the crash broke.
		if bouncer == nil {
			return false
		}
		var pgErr *pgconn.PgError
		lostConn := !errors.As(err, &pgErr) || strings.HasPrefix(pgErr.Code, "08")
		if !pgtest.WaitFor(5*time.Second, func() bool {
			return crashes() > before || bouncer.Down() || (lostConn && crashes() > 0)
		}) {
			return false
		}
		return pgtest.WaitFor(30*time.Second, func() bool { return !bouncer.Down() })
	}
	var total atomic.Int64
	var wg sync.WaitGroup
	for a := range appenders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(a), uint64(time.Now().UnixNano())))
			for total.Load() < target && ctx.Err() == nil {
				before := crashes()
				got, rollback, committing, err := appendTxRandom(ctx, store, rng, streams, rollbackPct)
				if err != nil && crashed(before, err) {
					mu.Lock()
					for id, sv := range got {
						if committing {
							unsure[id] = sv
						} else {
							rolledBack[id] = true
						}
					}
					mu.Unlock()
					continue
				}
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
	if bouncer != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if pgtest.WaitFor(5*time.Minute, func() bool { return total.Load() >= target/3 || ctx.Err() != nil }) && ctx.Err() == nil {
				bouncer.Crash()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	cut := len(unsure)
	resolveUnsure(ctx, t, pool, e.cfg.Schema, unsure, committed, rolledBack)
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
		if bouncer != nil {
			r.extra = append(r.extra, fmt.Sprintf("pooler_crashes=%d commits_cut=%d", crashes(), cut))
		}
		if crashes() > 0 {
			// A crash of the pooler cuts checkpoint writes and acks:
			// redeliveries are at-least-once's, counted, not judged.
			twice = 0
		}
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

// resolveUnsure reads which of the appends whose COMMIT was cut the store
// has: those committed, the others are as rolled back.
func resolveUnsure(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string, unsure, committed map[uuid.UUID]streamVersion,
	rolledBack map[uuid.UUID]bool) {
	t.Helper()
	if len(unsure) == 0 {
		return
	}
	ids := make([]uuid.UUID, 0, len(unsure))
	for id := range unsure {
		ids = append(ids, id)
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT event_id FROM %s.events WHERE event_id = ANY($1)`, pgx.Identifier{schema}.Sanitize()), ids)
	if err != nil {
		t.Fatalf("read the appends whose COMMIT was cut: %v", err)
	}
	stored, err := pgx.CollectRows(rows, pgx.RowTo[uuid.UUID])
	if err != nil {
		t.Fatalf("read the appends whose COMMIT was cut: %v", err)
	}
	for _, id := range stored {
		committed[id] = unsure[id]
		delete(unsure, id)
	}
	for id := range unsure {
		rolledBack[id] = true
	}
}

// appendTxRandom runs one transaction of one to three appends to distinct
// streams (in name order, so that two transactions never deadlock), with
// random delays between them, and commits it or (rollbackPct in 100) rolls
// it back. On an error it returns what it had appended, and whether its
// COMMIT was under way (the outcome is then unknown).
func appendTxRandom(ctx context.Context, store *eventsource.Store, rng *rand.Rand, streams, rollbackPct int) (
	got map[uuid.UUID]streamVersion, rollback, committing bool, err error) {
	names := map[string]bool{}
	for range 1 + rng.IntN(3) {
		names[fmt.Sprintf("%s-%d", categoryName, rng.IntN(streams))] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	slices.Sort(sorted)
	rollback = rng.IntN(100) < rollbackPct
	got = map[uuid.UUID]streamVersion{}
	tx, err := store.Pool().Begin(ctx)
	if err != nil {
		return got, false, false, err
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
			return got, false, false, err
		}
		for i, id := range res.IDs {
			got[id] = streamVersion{stream: stream, version: res.FirstVersion + int64(i)}
		}
	}
	time.Sleep(time.Duration(rng.IntN(5000)) * time.Microsecond)
	if rollback {
		return got, true, false, tx.Rollback(ctx)
	}
	if err := tx.Commit(ctx); err != nil {
		return got, false, true, err
	}
	store.WakeSequencer()
	return got, false, false, nil
}
