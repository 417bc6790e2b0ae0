package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestSequencerStall: the worker process that holds the sequencer row, in
// the middle of a step, freezes (SIGSTOP) or is cut off from the database
// (its proxy's blackhole: it runs on, its bytes vanish) under live appends,
// several times (3 in the short form, 8 in the long one; a fresh
// incarnation of the worker each time).
// Positions are handed out by the two workers' sequencers only (the
// appenders' own is stopped), so the frozen one is often the holder; the
// harness freezes it, at random moments, until it catches it holding the
// row. Then the other worker's sequencer must take over — the holder's
// session is ended, by its own idle timeout or by the other's evidence
// (eventsource.SequencerStallTimeout) — and nothing may be lost, skipped
// or reordered. The SUMMARY line says how long positions stalled
// (stall: from the freeze until the head moved again), what the server
// showed of the stalled holder, and how many of the holders the other
// worker's takeover ended (the rest ended by their own idle timeout).
func TestSequencerStall(t *testing.T) {
	for _, mode := range []string{"freeze", "blackhole"} {
		t.Run(mode, func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 8, Kind: leasestore.KindRow, HandlerDelay: time.Millisecond})
			stalled := e.c.start("w1", startOpts{viaProxy: true})
			taker := e.c.start("w2", startOpts{})
			if _, ok := e.o.waitFairSplit(e.c.live, 90*time.Second); !ok {
				t.Fatalf("no fair split: %s", e.o.ownedSummary())
			}
			e.startLoad(pick(300, 500), 200)
			_ = e.load.seq.Stop(context.Background()) // the workers sequence
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			pool, err := pgxpool.New(ctx, e.url)
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			time.Sleep(pick(500*time.Millisecond, 3*time.Second))

			var stalls []time.Duration
			holders := map[string]int{}
			for i := range pick(3, 8) {
				if i > 0 {
					// A fresh incarnation for each stall: a worker frozen
					// past its lease may finish the delivery it had in
					// flight once (a stale delivery, one per bucket lost),
					// and the harness counts those per incarnation.
					e.c.stop(stalled, 30*time.Second)
					stalled = e.c.start("w1", startOpts{viaProxy: true})
					if _, ok := e.o.waitFairSplit(e.c.live, 60*time.Second); !ok {
						t.Fatalf("no fair split after %s started: %s", stalled.id, e.o.ownedSummary())
					}
				}
				at, holder := catchHolding(ctx, t, e, pool, stalled)
				holders[holder]++
				if mode == "blackhole" {
					// Cut off while it holds the row, then thawed: it
					// runs on, and its next statement vanishes.
					stalled.proxy.cutBlackhole()
					e.c.markCut(stalled, true)
					e.c.resume(stalled)
				}
				e.faults = append(e.faults, fault{worker: stalled.id, at: at})
				stall, ok := headMovesAfter(ctx, pool, e.cfg.Schema, at)
				if !ok {
					t.Fatalf("positions never flowed again after %s stalled holding the sequencer row (%s)", stalled.id, holder)
				}
				stalls = append(stalls, stall)
				// Live appends go on being sequenced while it stays
				// stalled.
				time.Sleep(pick(time.Second, 3*time.Second))
				if mode == "blackhole" {
					stalled.proxy.heal()
					e.c.markCut(stalled, false)
				} else {
					e.c.resume(stalled)
				}
				if _, ok := e.o.waitFairSplit(e.c.live, 60*time.Second); !ok {
					t.Fatalf("the stalled worker never rejoined: %s", e.o.ownedSummary())
				}
			}
			byTakeover := countLines(taker.logPath, "ended a stalled holder")

			r := e.finish("sequencer-stall-"+mode, func(r *report) {
				skipped, unsequenced := positionGaps(ctx, t, pool, e.cfg.Schema)
				r.extra = append(r.extra, fmt.Sprintf("skipped=%d unsequenced=%d stall_p50=%s stall_max=%s (n=%d) holder=%s ended_by_takeover=%d/%d",
					skipped, unsequenced, pct(stalls, 50), pct(stalls, 100), len(stalls), holderStates(holders), byTakeover, len(stalls)))
				if skipped+unsequenced > 0 {
					t.Errorf("$all has %d gaps and %d events without a position", skipped, unsequenced)
				}
			})
			requireSafe(t, r)
		})
	}
}

// countLines counts the lines of path that contain s.
func countLines(path, s string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return strings.Count(string(b), s)
}

// holderStates formats what the server showed of the caught holders:
// "state/wait_event×n", sorted.
func holderStates(m map[string]int) string {
	var out []string
	for k, n := range m {
		out = append(out, fmt.Sprintf("%q×%d", k, n))
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// holderSQL names the session whose transaction holds the sequencer row,
// as eventsource's takeover finds it, with what the server shows of it.
const holderSQL = `SELECT coalesce(a.application_name, ''), coalesce(a.state, ''), coalesce(a.wait_event, '')
FROM %s.sequencer s
JOIN pg_catalog.pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = s.xmax AND l.granted AND l.mode = 'ExclusiveLock'
JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE s.id = 1`

// catchHolding freezes p at random moments until it is caught holding the
// sequencer row, and returns when it was frozen and what the server showed
// of its session (state/wait event). p stays frozen.
func catchHolding(ctx context.Context, t *testing.T, e *env, pool *pgxpool.Pool, p *proc) (time.Time, string) {
	t.Helper()
	q := fmt.Sprintf(holderSQL, pgx.Identifier{e.cfg.Schema}.Sanitize())
	rng := rand.New(rand.NewPCG(1, uint64(time.Now().UnixNano())))
	for attempt := 1; ctx.Err() == nil; attempt++ {
		at := time.Now()
		e.c.pause(p)
		waitStopped(ctx, t, p)
		var app, state, wait string
		err := pool.QueryRow(ctx, q).Scan(&app, &state, &wait)
		if err == nil && app == p.id {
			t.Logf("caught %s holding the sequencer row at attempt %d: %s/%s", p.id, attempt, state, wait)
			return at, state + "/" + wait
		}
		if err != nil && err != pgx.ErrNoRows {
			t.Fatalf("looking for the sequencer row's holder: %v", err)
		}
		e.c.resume(p)
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
	}
	t.Fatalf("%s was never caught holding the sequencer row", p.id)
	return time.Time{}, ""
}

// waitStopped waits until the kernel shows p stopped.
func waitStopped(ctx context.Context, t *testing.T, p *proc) {
	t.Helper()
	path := "/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat"
	for ctx.Err() == nil {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v", p.id, err)
		}
		// pid (comm) state …: the comm may hold spaces, not ')'.
		if f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:])); len(f) > 0 && f[0] == "T" {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// headMovesAfter polls the head from at until it moves, and returns how
// long after at that was.
func headMovesAfter(ctx context.Context, pool *pgxpool.Pool, schema string, at time.Time) (time.Duration, bool) {
	q := fmt.Sprintf(`SELECT last_position FROM %s.sequencer WHERE id = 1`, pgx.Identifier{schema}.Sanitize())
	var first int64
	if err := pool.QueryRow(ctx, q).Scan(&first); err != nil {
		return 0, false
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var h int64
		if err := pool.QueryRow(ctx, q).Scan(&h); err == nil && h > first {
			return time.Since(at), true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return 0, false
}

// positionGaps returns the positions missing from $all below its highest
// one, and the events without a position.
func positionGaps(ctx context.Context, t *testing.T, pool *pgxpool.Pool, schema string) (skipped, unsequenced int64) {
	t.Helper()
	err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(position), 0) - count(position), count(*) - count(position) FROM %s e`,
		eventsWithPositions(pgx.Identifier{schema}.Sanitize()))).Scan(&skipped, &unsequenced)
	if err != nil {
		t.Fatal(err)
	}
	return skipped, unsequenced
}
