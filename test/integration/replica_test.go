package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestReadsOnAReplica: two worker processes read their catch-up pages and
// their publisher's fetches on a real hot standby (-read-url) under a
// steady load of appends on the primary, while the standby's replay is
// paused (reads past -replica-wait go to the primary) and while it
// restarts (reads fail over to the primary and come back). Nothing is
// lost, skipped (no event below its bucket's checkpoint missing from the
// sink) or delivered out of stream order; the workers' metrics show reads
// on the standby and on the primary. The long form (KUMI_CHAOS=long) runs
// more cycles with longer pauses.
func TestReadsOnAReplica(t *testing.T) {
	srv := pgtest.LocalServer(t)
	e := newEnv(t, srv.URL, clusterConfig{Buckets: 8, Kind: leasestore.KindRow})
	r := pgtest.NewReplica(t, srv)
	e.c.cfg.Extra = append(e.c.cfg.Extra, "-read-url", r.URL, "-replica-wait", "200ms")
	e.startWorkers(2, startOpts{})
	e.startLoad(pick(200, 400), 50)

	ctx := context.Background()
	cycles, pause := pick(1, 4), pick(4*time.Second, 20*time.Second)
	for range cycles {
		time.Sleep(2 * time.Second)
		if err := r.PauseReplay(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
		if err := r.ResumeReplay(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
		if err := r.Restart(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2 * time.Second)
	}
	rep := e.finish("reads-on-a-replica", func(rep *report) {
		var standby, primary float64
		for _, p := range e.c.all {
			standby += scrapeLabeled(p, "kumi_replica_reads", `kumi_read_on="standby"`)
			primary += scrapeLabeled(p, "kumi_replica_reads", `kumi_read_on="primary"`)
		}
		skipped := skippedEvents(t, e)
		rep.extra = append(rep.extra, fmt.Sprintf("skipped=%d standby_reads=%.0f primary_reads=%.0f", skipped, standby, primary))
		if skipped != 0 {
			t.Errorf("%d events below their bucket's checkpoint never reached the sink", skipped)
		}
		if standby == 0 || primary == 0 {
			t.Errorf("reads on the standby %.0f, on the primary %.0f: both should be some", standby, primary)
		}
	})
	requireSafe(t, rep)
}

// skippedEvents counts the events of e's category at or below their
// bucket's checkpoint that are not in the sink: events a reader moved its
// cursor past without delivering them.
func skippedEvents(t *testing.T, e *env) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
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
	list, err := store.Checkpoints(ctx, e.cfg.Subscription)
	if err != nil {
		t.Fatal(err)
	}
	cps := map[int]int64{}
	for _, cp := range list {
		cps[cp.Bucket] = cp.Position
	}
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT event_id FROM %s.sink WHERE subscription = $1`,
		pgx.Identifier{e.cfg.Schema}.Sanitize()), e.cfg.Subscription)
	if err != nil {
		t.Fatal(err)
	}
	sunk := map[uuid.UUID]bool{}
	var id uuid.UUID
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error { sunk[id] = true; return nil }); err != nil {
		t.Fatal(err)
	}
	skipped := 0
	for after := int64(0); ; {
		events, err := store.ReadCategory(ctx, e.cfg.Category, after, 5000)
		if err != nil {
			t.Fatal(err)
		}
		if len(events) == 0 {
			return skipped
		}
		for _, ev := range events {
			if ev.Position <= cps[eventsource.BucketOfHash(ev.Hash, e.cfg.Buckets)] && !sunk[ev.ID] {
				skipped++
			}
		}
		after = events[len(events)-1].Position
	}
}
