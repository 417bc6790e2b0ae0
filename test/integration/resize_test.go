package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestResizeUp: three workers share 8 buckets under steady appends; the
// subscription is resized to 32 while a worker joins, one leaves gracefully
// (SIGTERM) and one is killed (SIGKILL) holding buckets of the old
// generation, and its slot restarts — with the old bucket count in its
// options, which the database's overrules. Nothing is lost, first
// deliveries stay in stream order, no checkpoint moves back, no lease is
// taken while valid; duplicates only after the kill.
func TestResizeUp(t *testing.T) { resizeScenario(t, "resize-up", 8, 32) }

// TestResizeDown is TestResizeUp from 32 buckets to 8.
func TestResizeDown(t *testing.T) { resizeScenario(t, "resize-down", 32, 8) }

func resizeScenario(t *testing.T, scenario string, n, m int) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			url := pgtest.URL(t)
			e := newEnv(t, url, clusterConfig{Buckets: n, Kind: kind})
			slots := e.startWorkers(3, startOpts{})
			e.startLoad(pick(100, 300), 200)
			time.Sleep(pick(time.Second, 5*time.Second)) // a backlog and some progress before the resize

			ctx, cancel := context.WithTimeout(context.Background(), pick(3*time.Minute, 10*time.Minute))
			defer cancel()
			pool, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
			if err != nil {
				t.Fatal(err)
			}
			requested := time.Now()
			var cutAt, switchedAt time.Time
			r, err := actors.Resize(ctx, store, e.cfg.Subscription, m, actors.ResizeOptions{By: "fault-suite"})
			if err != nil {
				t.Fatalf("request: %v", err)
			}
			type outcome struct {
				r   leasestore.Resize
				err error
			}
			done := make(chan outcome, 1)
			go func() {
				r, err := actors.FollowResize(ctx, store, r, actors.ResizeOptions{Poll: 20 * time.Millisecond,
					Progress: func(r leasestore.Resize) {
						if r.CutDecided && cutAt.IsZero() {
							cutAt = time.Now()
						}
						if r.State == leasestore.ResizeSwitched && switchedAt.IsZero() {
							switchedAt = time.Now()
						}
					}})
				done <- outcome{r, err}
			}()

			// During the resize: a worker joins, one leaves, one is killed
			// and comes back with the old bucket count in its options.
			e.c.start("w4", startOpts{})
			e.c.stop(e.c.current(slots[1]), time.Minute)
			victim := e.c.current(slots[2])
			at := time.Now()
			e.c.kill(victim)
			e.faults = append(e.faults, fault{worker: victim.id, at: at})
			e.c.start(slots[2], startOpts{})

			out := <-done
			if out.err != nil {
				t.Fatalf("resize %d → %d did not complete: %v (last read: %+v)", n, m, out.err, out.r)
			}
			finished := time.Now()
			// Appends go on under the new generation, and a worker restarted
			// after the resize with the old count serves it too.
			e.c.stop(e.c.current("w4"), time.Minute)
			e.c.start("w4", startOpts{})
			time.Sleep(pick(time.Second, 5*time.Second))

			rep := e.finish(scenario, func(rep *report) {
				rep.extra = append(rep.extra, fmt.Sprintf("resize=%d->%d generation=%d cut=%d to_cut=%s to_switch=%s to_done=%s "+
					"duplicates_not_from_the_kill=%d", n, m, out.r.Generation, cutOf(ctx, t, pool, e.cfg.Schema),
					since(requested, cutAt), since(requested, switchedAt), round(finished.Sub(requested)),
					duplicatesNotFrom(ctx, t, pool, e.cfg.Schema, victim.id)))
			})
			requireSafe(t, rep)
			if out.r.Buckets != m || out.r.Generation != 1 {
				t.Errorf("after the resize: %d buckets, generation %d; want %d, 1", out.r.Buckets, out.r.Generation, m)
			}
		})
	}
}

// cutOf reads the first generation's end: the resize's cut.
func cutOf(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string) int64 {
	var cut int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(end_at, -1) FROM `+pgx.Identifier{schema}.Sanitize()+`.generations
		WHERE subscription = $1 AND generation = 0`, subscriptionName).Scan(&cut); err != nil {
		t.Errorf("read the cut: %v", err)
	}
	return cut
}

// since is the time from start to at, "-" when at was not seen (a
// transition between two polls of the follower).
func since(start, at time.Time) string {
	if at.IsZero() {
		return "-"
	}
	return round(at.Sub(start)).String()
}

// duplicatesNotFrom counts the deliveries beyond the first of events whose
// first delivery was not by worker: duplicates the kill of worker does not
// explain (a lease that lapsed on a loaded machine would).
func duplicatesNotFrom(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema, worker string) int64 {
	var n int64
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(deliveries - 1), 0) FROM `+pgx.Identifier{schema}.Sanitize()+`.sink
		WHERE subscription = $1 AND worker <> $2`, subscriptionName, worker).Scan(&n); err != nil {
		t.Errorf("count duplicates: %v", err)
	}
	return n
}
