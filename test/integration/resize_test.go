package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
)

// TestResizeUp: three workers serve 8 buckets under steady appends; the
// subscription is resized to 32 (long form: and back to 8, twice) while a worker joins, one holding an undrained old bucket is
// killed with SIGKILL, and one leaves gracefully (SIGTERM). Nothing is
// lost, first deliveries stay in stream order, no checkpoint moves back,
// no lease is taken while valid; no event of the old generation is
// delivered first after its old bucket drained and none of the new one
// before the old buckets feeding its new bucket drained (cross, early);
// every duplicate was first delivered by a killed worker.
func TestResizeUp(t *testing.T) { runResize(t, "resize-up", 8, 32) }

// TestResizeDown is TestResizeUp from 32 buckets to 8.
func TestResizeDown(t *testing.T) { runResize(t, "resize-down", 32, 8) }

func runResize(t *testing.T, scenario string, from, to int) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: from, Kind: kind, HandlerDelay: time.Millisecond})
			slots := e.startWorkers(3, startOpts{})
			e.startLoad(pick(150, 300), 200)
			e.o.waitHandled(t, 50, time.Minute)
			targets := []int{to}
			if long {
				targets = []int{to, from, to, from} // up and back down twice
			}
			next := len(slots) + 1
			killed := map[string]bool{}
			var during int
			for _, m := range targets {
				// A backlog in the old buckets keeps the resize running
				// while the faults land in it.
				e.appendBacklog(pick(12000, 20000), 200)
				rs := e.resize(m)
				joiner := fmt.Sprintf("w%d", next)
				next++
				joined := e.c.start(joiner, startOpts{})
				slots = append(slots, joiner)
				// Kill the holder of an undrained old bucket once the cut
				// is decided.
				cur := e.waitResize(func(r leasestore.Resize) bool { return r.CutDecided || !r.Resizing() })
				victim := undrainedOwner(cur, joined.id)
				if victim == nil || !cur.Resizing() {
					t.Fatalf("the resize to %d ended before a holder of an old bucket could be killed: %+v", m, cur)
				}
				p := e.c.byID(victim.Owner)
				if p == nil {
					t.Fatalf("no process runs %s (holder of old bucket %d)", victim.Owner, victim.Bucket)
				}
				at := time.Now()
				e.c.kill(p)
				killed[p.id] = true
				e.faults = append(e.faults, fault{worker: p.id, at: at})
				if e.resizing() {
					during++
				}
				e.c.start(p.slot, startOpts{})
				// A graceful leave: a worker other than the joiner and the
				// restarted one.
				var leaver *proc
				for _, s := range slots {
					if q := e.c.current(s); s != p.slot && s != joiner && q != nil && q.running() {
						leaver = q
						break
					}
				}
				if leaver != nil {
					if e.resizing() {
						during++
					}
					e.c.stop(leaver, time.Minute)
				}
				done := e.waitResize(func(r leasestore.Resize) bool { return !r.Resizing() && r.Generation > rs.Generation })
				if done.Buckets != m {
					t.Fatalf("resized to %d buckets, want %d", done.Buckets, m)
				}
				if leaver != nil {
					e.c.start(leaver.slot, startOpts{})
				}
				if _, ok := e.o.waitFairSplit(e.c.live, time.Minute); !ok {
					t.Errorf("no fair split of the %d buckets after the resize: %s", m, e.o.ownedSummary())
				}
			}
			var rr resizeReport
			r := e.finish(scenario, func(r *report) {
				rr = e.o.resizeReport(t, killed, nil)
				r.extra = append(r.extra, rr.fields(), fmt.Sprintf("faults_during_resize=%d/%d", during, 2*len(targets)))
			})
			requireSafe(t, r)
			requireResizeSafe(t, r.scenario, rr, len(targets))
		})
	}
}

// TestResizeLatency measures a resize without faults: three workers, 8
// buckets, steady appends; 8 → 16 with the workers caught up, then
// 16 → 8 with a backlog behind every old bucket. Reported per resize:
// from the request to the cut, to the first delivery of the new
// generation and to completion, and the pause deliveries saw (their
// latency beyond the run's steady latency, for the events appended while
// the resize ran). Its invariants are TestResizeUp's.
func TestResizeLatency(t *testing.T) {
	for _, kind := range []leasestore.Kind{leasestore.KindRow, leasestore.KindSession} {
		t.Run(kind.String(), func(t *testing.T) {
			e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 8, Kind: kind})
			e.startWorkers(3, startOpts{})
			e.startLoad(pick(150, 300), 200)
			e.o.waitHandled(t, 200, time.Minute)
			for _, step := range []struct {
				to      int
				backlog int
			}{{16, 0}, {8, pick(5000, 100000)}} {
				if step.backlog > 0 {
					e.appendBacklog(step.backlog, 1000)
				}
				rs := e.resize(step.to)
				e.waitResize(func(r leasestore.Resize) bool { return !r.Resizing() && r.Generation > rs.Generation })
				e.o.waitHandledAll(t, 3*time.Minute)
			}
			var rr resizeReport
			r := e.finish("resize-latency", func(r *report) {
				rr = e.o.resizeReport(t, nil, nil)
				r.extra = append(r.extra, rr.fields())
			})
			requireSafe(t, r)
			requireResizeSafe(t, r.scenario, rr, 2)
			// No fault, no kill: every duplicated event must have been
			// first delivered by a worker that then lost a lease without
			// consent (too slow to renew on a loaded machine);
			// requireResizeSafe counts the others as unexcused.
			if r.duplicates != 0 && rr.lapsed == 0 {
				t.Errorf("%s: %d duplicates without a fault", r.scenario, r.duplicates)
			}
		})
	}
}

// resize asks for the subscription's bucket count to become m as an
// operator does, with `kumi resize --no-wait` (which builds the index for
// m concurrently, then requests), and returns the subscription as it was
// before the request.
func (e *env) resize(m int) leasestore.Resize {
	e.t.Helper()
	before, ok := e.readResize()
	if !ok || before.Resizing() {
		e.t.Fatalf("resize to %d: the subscription is not steady: %+v", m, before)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, kumiBin, "--schema", e.cfg.Schema, "resize", "-s", e.cfg.Subscription,
		"--buckets", strconv.Itoa(m), "--no-wait")
	cmd.Env = append(os.Environ(), "DATABASE_URL="+withAppName(e.url, "operator"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		e.t.Fatalf("kumi resize to %d: %v\n%s", m, err, out)
	}
	return before
}

// readResize reads the subscription's resize (false when the read fails,
// a restarting server say).
func (e *env) readResize() (leasestore.Resize, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := leasestore.ReadResize(ctx, e.o.pool, e.cfg.Schema, e.cfg.Subscription)
	return r, err == nil
}

// resizing reports whether a resize runs now.
func (e *env) resizing() bool {
	r, ok := e.readResize()
	return ok && r.Resizing()
}

// waitResize polls the subscription's resize until cond holds, and fails
// the test after a deadline (row leases wait a ttl for a killed holder's
// buckets).
func (e *env) waitResize(cond func(leasestore.Resize) bool) leasestore.Resize {
	e.t.Helper()
	var last leasestore.Resize
	if !pgtest.WaitFor(pick(90*time.Second, 5*time.Minute), func() bool {
		r, ok := e.readResize()
		if ok {
			last = r
		}
		return ok && cond(r)
	}) {
		e.t.Fatalf("resize: no progress: state %s, generation %d, %d → %d, cut %d (decided %v); old %s; new %s; workers own: %s%s",
			last.State, last.Generation, last.Buckets, last.NextBuckets, last.Cut, last.CutDecided,
			slotsSummary(last.Old), slotsSummary(last.New), e.o.ownedSummary(), e.undrainedReport(last))
	}
	return last
}

// undrainedReport says, for each old bucket held and not drained, what
// its holder says of it: its reader's entry in the worker's /status, the
// worker's log lines about the slot, and the tail of its log.
func (e *env) undrainedReport(r leasestore.Resize) string {
	var b strings.Builder
	tailed := map[string]bool{}
	for _, s := range r.Old {
		if s.Owner == "" || s.Drained {
			continue
		}
		fmt.Fprintf(&b, "\n--- old bucket %d (slot %d, proposal %d) held by %s at epoch %d", s.Bucket, s.Slot, s.Proposal,
			s.Owner, s.Epoch)
		p := e.c.byID(s.Owner)
		if p == nil {
			b.WriteString(": no running process of that id")
			continue
		}
		fmt.Fprintf(&b, "\nits /status: %s", slotStatus(p, s.Slot))
		fmt.Fprintf(&b, "\nits log about slot %d (last 20 lines):\n%s", s.Slot,
			grepTail(p.logPath, 20, fmt.Sprintf("slot=%d ", s.Slot), fmt.Sprintf("bucket=%d ", s.Slot)))
		if !tailed[p.id] {
			tailed[p.id] = true
			fmt.Fprintf(&b, "\n%s's log's tail:\n%s", p.id, tail(p.logPath, 30))
		}
	}
	return b.String()
}

// readStatus reads p's /status page: its HTTP status and body, or why
// it could not be read.
func readStatus(p *proc) (status string, body []byte, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.metricsAddr+"/status", nil)
	if err != nil {
		return "", nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", nil, err
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return resp.Status, nil, fmt.Errorf("%s: %w", resp.Status, err)
	}
	return resp.Status, body, nil
}

// rawStatus is p's /status page as it serves it, or why it could not be
// read.
func rawStatus(p *proc) string {
	status, body, err := readStatus(p)
	if err != nil {
		return err.Error()
	}
	return status + " " + string(body)
}

// slotStatus returns the entry of slot in the /status of the worker p,
// with how far its publisher has read, or why there is none.
func slotStatus(p *proc, slot int) string {
	status, body, err := readStatus(p)
	if err != nil {
		return err.Error()
	}
	var page struct {
		Subscriptions []observability.SubscriptionStatus `json:"subscriptions"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		return fmt.Sprintf("%s: %v", status, err)
	}
	for _, sub := range page.Subscriptions {
		for _, o := range sub.Owned {
			if o.Slot == slot {
				out, _ := json.Marshal(o)
				return fmt.Sprintf("%s; its publisher read through %d", out, sub.Published)
			}
		}
	}
	return fmt.Sprintf("slot %d is not among its owned buckets", slot)
}

// grepTail returns the last n lines of path containing one of keys (a
// line's end counts as a space).
func grepTail(path string, n int, keys ...string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range keys {
			if strings.Contains(l+" ", k) {
				lines = append(lines, l)
				break
			}
		}
	}
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// undrainedOwner returns an old bucket that has an owner other than
// except and has not drained, or nil.
func undrainedOwner(r leasestore.Resize, except string) *leasestore.SlotStatus {
	for i, s := range r.Old {
		if s.Owner != "" && s.Owner != except && !s.Drained {
			return &r.Old[i]
		}
	}
	return nil
}

func slotsSummary(ss []leasestore.SlotStatus) string {
	var b strings.Builder
	for _, s := range ss {
		fmt.Fprintf(&b, "%d:%s", s.Bucket, s.Owner)
		if s.Drained {
			b.WriteString("(drained)")
		} else if s.Proposal >= 0 {
			fmt.Fprintf(&b, "(proposed %d)", s.Proposal)
		}
		if s.Ready {
			b.WriteString("(ready)")
		}
		b.WriteString(" ")
	}
	return b.String()
}

// logOf returns the path of the log of worker id, running or not, or "".
func (c *cluster) logOf(id string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.all {
		if p.id == id {
			return p.logPath
		}
	}
	return ""
}

// logAround returns up to n lines of the log at path written between
// from and to that contain one of keys or are warnings or errors.
func logAround(path string, from, to time.Time, n int, keys ...string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		ts, _, ok := strings.Cut(strings.TrimPrefix(l, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if !ok || err != nil || at.Before(from) || at.After(to) {
			continue
		}
		keep := strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR")
		for _, k := range keys {
			keep = keep || strings.Contains(l+" ", k)
		}
		if keep {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = append(lines[:n/2:n/2], append([]string{"…"}, lines[len(lines)-n/2:]...)...)
	}
	return strings.Join(lines, "\n")
}

// byID returns the process running worker id, or nil.
func (c *cluster) byID(id string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.all {
		if p.id == id && p.running() {
			return p
		}
	}
	return nil
}

// appendBacklog appends n events at once over streams streams, in
// batches, so that every bucket has events waiting.
func (e *env) appendBacklog(n, streams int) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, withAppName(e.url, "backlog"))
	if err != nil {
		e.t.Fatalf("backlog: %v", err)
	}
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		e.t.Fatalf("backlog: %v", err)
	}
	rng := rand.New(rand.NewPCG(7, uint64(time.Now().UnixNano())))
	const batch = 50
	for done := 0; done < n; done += batch {
		events := make([]eventsource.EventData, min(batch, n-done))
		for i := range events {
			data, _ := json.Marshal(map[string]int{"backlog": done + i})
			events[i] = eventsource.EventData{Type: "Ticked", Data: data}
		}
		stream := fmt.Sprintf("%s-%d", e.cfg.Category, rng.IntN(streams))
		if _, err := store.Append(ctx, stream, eventsource.Any, events); err != nil {
			e.t.Fatalf("backlog: %v", err)
		}
	}
	store.WakeSequencer()
}

// waitHandled waits until the sink holds at least n deliveries.
func (o *observer) waitHandled(t *testing.T, n int64, timeout time.Duration) {
	t.Helper()
	q := fmt.Sprintf(`SELECT count(*) FROM %s.sink WHERE subscription = $1`, o.q)
	pgtest.Eventually(t, timeout, func() bool {
		var got int64
		return o.pool.QueryRow(context.Background(), q, o.sub).Scan(&got) == nil && got >= n
	}, "%d deliveries", n)
}

// waitHandledAll waits until every event of the category appended so far
// is in the sink.
func (o *observer) waitHandledAll(t *testing.T, timeout time.Duration) {
	t.Helper()
	var head int64
	if err := o.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT coalesce(max(last_position), 0) FROM %s.appends
		WHERE category = $1`, o.q), o.cat).Scan(&head); err != nil {
		t.Fatalf("observer: head: %v", err)
	}
	q := fmt.Sprintf(`SELECT count(*) FROM `+eventsWithPositions(o.q)+` e WHERE e.category = $1 AND (e.position IS NULL OR e.position <= $3)
		AND NOT EXISTS (SELECT 1 FROM %[1]s.sink s WHERE s.subscription = $2 AND s.event_id = e.event_id)`, o.q)
	if !pgtest.WaitFor(timeout, func() bool {
		var missing int64
		return o.pool.QueryRow(context.Background(), q, o.cat, o.sub, head).Scan(&missing) == nil && missing == 0
	}) {
		t.Fatalf("observer: not every event up to position %d reached the sink within %v:\n%s", head, timeout, o.undelivered(head))
	}
}

// undelivered describes, for a failure message, the events up to head
// that are not in the sink (per bucket of the serving generation: how
// many, the first position) beside the checkpoints, the lease owners and
// the subscription's resize state.
func (o *observer) undelivered(head int64) string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var b strings.Builder
	dump := func(title, sql string, args ...any) {
		rows, err := o.pool.Query(ctx, sql, args...)
		if err != nil {
			fmt.Fprintf(&b, "%s: %v\n", title, err)
			return
		}
		defer rows.Close()
		fmt.Fprintf(&b, "%s:", title)
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				fmt.Fprintf(&b, " %v", err)
				break
			}
			fmt.Fprintf(&b, " %v", vals)
		}
		b.WriteString("\n")
	}
	dump("missing (bucket, events, first position, unpositioned)", fmt.Sprintf(`SELECT %[1]s.cg_bucket(e.cg_hash, s.bucket_count), count(*), min(e.position), count(*) FILTER (WHERE e.position IS NULL)
		FROM `+eventsWithPositions(o.q)+` e JOIN %[1]s.subscriptions s ON s.subscription = $2
		WHERE e.category = $1 AND (e.position IS NULL OR e.position <= $3)
			AND NOT EXISTS (SELECT 1 FROM %[1]s.sink k WHERE k.subscription = $2 AND k.event_id = e.event_id)
		GROUP BY 1 ORDER BY 1`, o.q), o.cat, o.sub, head)
	dump("subscription (generation, buckets, state, next, cut)", fmt.Sprintf(`SELECT generation, bucket_count, state, next_bucket_count, cut
		FROM %s.subscriptions WHERE subscription = $1`, o.q), o.sub)
	dump("checkpoints (slot, position)", fmt.Sprintf(`SELECT bucket, position FROM %s.checkpoints WHERE subscription = $1 ORDER BY bucket`, o.q), o.sub)
	b.WriteString("owners: " + o.ownedSummary() + "\n")
	return b.String()
}

// resizeStep is one resize as the observer's logs show it.
type resizeStep struct {
	from, to, generation int // generation is the new one
	cut                  int64
	requested, cutAt     time.Time
	switched, done       time.Time
	firstNew             time.Time // the first delivery of an event of the new generation
	// pause: per event appended while the resize ran, its delivery latency
	// beyond the run's steady latency (p50 before the first request).
	pauseP50, pauseP99, pauseMax time.Duration
}

// resizeReport is what the observer found about a scenario's resizes.
type resizeReport struct {
	steps []resizeStep
	// cross: first deliveries of an old generation's event after its old
	// bucket drained, plus drains to a position other than the cut;
	// early: deliveries of a new generation's event before every old
	// bucket feeding its new bucket drained.
	cross, early int64
	// unexcused: events delivered more than once that no fault excuses
	// (resizeReport): graceful joins, leaves and handoffs duplicate
	// nothing. lapsed: those excused only by their first deliverer's lease
	// lost without consent (on a loaded machine, a worker of the run that
	// missed its heartbeats).
	unexcused, lapsed int64
	// unexcusedStory tells what the observer's logs hold of the first
	// unexcused duplicates (see unexcusedStory).
	unexcusedStory string
}

// ids are the keys of set.
func ids(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
	}
	return out
}

// resizeReport reads the resizes, the cross and early deliveries and the
// duplicates from the logs; killed are the worker ids the scenario killed,
// frozen those it froze (SIGSTOP) and thawed or killed.
func (o *observer) resizeReport(t *testing.T, killed, frozen map[string]bool) resizeReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	must := func(err error, what string) {
		if err != nil {
			t.Fatalf("observer: resize report: %s: %v", what, err)
		}
	}
	var rr resizeReport
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT g.generation, p.bucket_count, g.bucket_count, g.start_after,
		(SELECT min(at) FROM %[1]s.obs_subscription_log l WHERE l.subscription = $1 AND l.generation = g.generation - 1 AND l.state = 'sealing'),
		(SELECT min(at) FROM %[1]s.obs_subscription_log l WHERE l.subscription = $1 AND l.generation = g.generation - 1 AND l.state = 'cut'),
		(SELECT min(at) FROM %[1]s.obs_subscription_log l WHERE l.subscription = $1 AND l.generation = g.generation - 1 AND l.state = 'switched'),
		(SELECT min(at) FROM %[1]s.obs_subscription_log l WHERE l.subscription = $1 AND l.generation = g.generation AND l.state = 'steady')
		FROM %[1]s.generations g JOIN %[1]s.generations p ON p.subscription = g.subscription AND p.generation = g.generation - 1
		WHERE g.subscription = $1 AND g.start_after IS NOT NULL ORDER BY g.generation`, o.q), o.sub)
	must(err, "generations")
	for rows.Next() {
		var s resizeStep
		var req, cut, sw, done *time.Time
		must(rows.Scan(&s.generation, &s.from, &s.to, &s.cut, &req, &cut, &sw, &done), "generations")
		s.requested, s.cutAt, s.switched, s.done = deref(req), deref(cut), deref(sw), deref(done)
		rr.steps = append(rr.steps, s)
	}
	must(rows.Err(), "generations")

	// The generation whose positions hold an event, its slot, and the old
	// generation before it.
	const eventGen = `JOIN LATERAL (
			SELECT g.generation, g.bucket_count FROM %[1]s.generations g
			WHERE g.subscription = $1 AND e.position > coalesce(g.start_after, 0) AND (g.end_at IS NULL OR e.position <= g.end_at)
			ORDER BY g.generation LIMIT 1) g ON true`
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.obs_delivery_log d
		JOIN `+eventsWithPositions(o.q)+` e ON e.event_id = d.event_id `+eventGen+`
		JOIN %[1]s.obs_drain_log r ON r.subscription = $1 AND r.bucket = g.generation * 65536 + %[1]s.cg_bucket(e.cg_hash, g.bucket_count)
		WHERE d.subscription = $1 AND d.first AND d.at > r.at`, o.q), o.sub).Scan(&rr.cross), "cross")
	var badDrains int64
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.obs_drain_log r
		JOIN %[1]s.generations g ON g.subscription = r.subscription AND g.generation = r.generation
		WHERE r.subscription = $1 AND r.cut IS DISTINCT FROM g.end_at`, o.q), o.sub).Scan(&badDrains), "drains")
	rr.cross += badDrains
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.obs_delivery_log d
		JOIN `+eventsWithPositions(o.q)+` e ON e.event_id = d.event_id `+eventGen+`
		JOIN %[1]s.generations p ON p.subscription = $1 AND p.generation = g.generation - 1
		JOIN LATERAL (
			SELECT count(*) AS n, max(r.at) AS last FROM %[1]s.obs_drain_log r
			WHERE r.subscription = $1 AND r.generation = p.generation
				AND (r.bucket %% 65536) %% gcd(p.bucket_count, g.bucket_count)
					= %[1]s.cg_bucket(e.cg_hash, g.bucket_count) %% gcd(p.bucket_count, g.bucket_count)) f ON true
		WHERE d.subscription = $1 AND (f.n < p.bucket_count / gcd(p.bucket_count, g.bucket_count) OR d.at < f.last)`, o.q),
		o.sub).Scan(&rr.early), "early")
	// A duplicate is excused (docs/guarantees.md, when duplicates happen)
	// when a killed worker delivered it first, a frozen one delivered it
	// at all (a zombie's late delivery too), or its first deliverer lost
	// the event's bucket without consent after that delivery — its lease
	// lapsed or its session went, and the next owner (or itself, at a new
	// epoch) redelivered from the checkpoint — or before it: the first
	// delivery was a zombie's, in flight when another worker took the
	// bucket over (the last change of the bucket's owner before it moved
	// it from that worker to another, without consent); never after a
	// cooperative handoff, which releases the bucket first.
	duplicates := fmt.Sprintf(`SELECT s.event_id, s.position, s.worker, s.first_at,
			g.generation * 65536 + %[1]s.cg_bucket(e.cg_hash, g.bucket_count) AS slot,
			(s.worker = ANY($2::text[]) OR z.by) AS faulted, x.lapsed
		FROM %[1]s.sink s
		JOIN `+eventsWithPositions(o.q)+` e ON e.event_id = s.event_id `+eventGen+`
		CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM %[1]s.obs_delivery_log d
			WHERE d.subscription = $1 AND d.event_id = s.event_id AND d.app = ANY($3::text[])) AS by) z
		CROSS JOIN LATERAL (SELECT EXISTS (SELECT 1 FROM %[1]s.obs_lease_log l
			WHERE l.subscription = $1 AND l.bucket = g.generation * 65536 + %[1]s.cg_bucket(e.cg_hash, g.bucket_count)
				AND l.old_owner = s.worker AND l.new_owner IS NOT NULL AND l.new_epoch > l.old_epoch
				AND l.at > s.first_at)
			OR coalesce((SELECT l.old_owner = s.worker AND l.new_owner IS NOT NULL AND l.new_owner <> s.worker
					AND l.new_epoch > l.old_epoch
				FROM %[1]s.obs_lease_log l
				WHERE l.subscription = $1 AND l.bucket = g.generation * 65536 + %[1]s.cg_bucket(e.cg_hash, g.bucket_count)
					AND l.at <= s.first_at
				ORDER BY l.at DESC LIMIT 1), false) AS lapsed) x
		WHERE s.subscription = $1 AND s.deliveries > 1`, o.q)
	must(o.pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE NOT (faulted OR lapsed)),
			count(*) FILTER (WHERE lapsed AND NOT faulted)
		FROM (`+duplicates+`) d`, o.sub, ids(killed), ids(frozen)).Scan(&rr.unexcused, &rr.lapsed), "duplicates")
	if rr.unexcused > 0 {
		rr.unexcusedStory = o.unexcusedStory(ctx, duplicates, ids(killed), ids(frozen))
	}

	var steady float64
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM s.first_at - e.recorded_at)), 0)
		FROM `+eventsWithPositions(o.q)+` e JOIN %[1]s.sink s ON s.subscription = $1 AND s.event_id = e.event_id
		WHERE e.category = $2 AND e.recorded_at < $3`, o.q), o.sub, o.cat, firstRequest(rr.steps)).Scan(&steady), "steady latency")
	for i := range rr.steps {
		s := &rr.steps[i]
		var first *time.Time
		var p50, p99, pmax float64
		must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT min(s.first_at) FROM `+eventsWithPositions(o.q)+` e
			JOIN %[1]s.sink s ON s.subscription = $1 AND s.event_id = e.event_id
			WHERE e.category = $2 AND e.position > $3`, o.q), o.sub, o.cat, s.cut).Scan(&first), "first new")
		s.firstNew = deref(first)
		must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(percentile_cont(0.5) WITHIN GROUP (ORDER BY x), 0),
			coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY x), 0), coalesce(max(x), 0)
			FROM (SELECT greatest(extract(epoch FROM s.first_at - e.recorded_at) - $5, 0) AS x
				FROM `+eventsWithPositions(o.q)+` e JOIN %[1]s.sink s ON s.subscription = $1 AND s.event_id = e.event_id
				WHERE e.category = $2 AND e.recorded_at >= $3 AND e.recorded_at <= $4) p`, o.q),
			o.sub, o.cat, s.requested, s.done, steady).Scan(&p50, &p99, &pmax), "pause")
		s.pauseP50, s.pauseP99, s.pauseMax = seconds(p50), seconds(p99), seconds(pmax)
	}
	return rr
}

func deref(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

func firstRequest(steps []resizeStep) time.Time {
	if len(steps) == 0 || steps[0].requested.IsZero() {
		return time.Now().Add(24 * time.Hour)
	}
	return steps[0].requested
}

// since renders b - a, "-" when either is unknown.
func since(a, b time.Time) string {
	if a.IsZero() || b.IsZero() {
		return "-"
	}
	return round(b.Sub(a)).String()
}

// fields renders the report for the SUMMARY line.
func (rr resizeReport) fields() string {
	var b strings.Builder
	fmt.Fprintf(&b, "resizes=%d cross=%d early=%d unexcused_duplicates=%d lapsed_duplicates=%d", len(rr.steps), rr.cross,
		rr.early, rr.unexcused, rr.lapsed)
	for _, s := range rr.steps {
		fmt.Fprintf(&b, " resize=%d->%d cut=%d to_cut=%s to_first_new=%s to_switch=%s to_done=%s pause_p50=%s pause_p99=%s pause_max=%s",
			s.from, s.to, s.cut, since(s.requested, s.cutAt), since(s.requested, s.firstNew), since(s.requested, s.switched),
			since(s.requested, s.done), round(s.pauseP50), round(s.pauseP99), round(s.pauseMax))
	}
	return b.String()
}

// requireResizeSafe asserts a resize's own invariants: every requested
// resize completed, nothing crossed the cut, no new bucket started before
// its feeders drained, and only kills duplicated.
func requireResizeSafe(t *testing.T, scenario string, rr resizeReport, resizes int) {
	t.Helper()
	if len(rr.steps) != resizes {
		t.Errorf("%s: %d resizes completed, want %d", scenario, len(rr.steps), resizes)
	}
	if rr.cross != 0 {
		t.Errorf("%s: %d old-generation deliveries after their bucket drained (or drains off the cut)", scenario, rr.cross)
	}
	if rr.early != 0 {
		t.Errorf("%s: %d new-generation deliveries before their feeders drained", scenario, rr.early)
	}
	if rr.unexcused != 0 {
		t.Errorf("%s: %d events delivered twice that no fault excuses (not first delivered by a killed worker, "+
			"nor delivered by a frozen one, nor redelivered after a lease lost without consent)%s", scenario, rr.unexcused,
			rr.unexcusedStory)
	}
}

// unexcusedStory tells, for the first few duplicates of the query
// duplicates (resizeReport's) that no fault excuses, every delivery of
// the event, and around them the changes of its slot's lease, its
// checkpoint writes and its drain.
func (o *observer) unexcusedStory(ctx context.Context, duplicates string, killed, frozen []string) string {
	var b strings.Builder
	fail := func(what string, err error) string {
		fmt.Fprintf(&b, "\n(%s: %v)", what, err)
		return b.String()
	}
	rows, err := o.pool.Query(ctx, `SELECT event_id, position, worker, first_at, slot FROM (`+duplicates+`) d
		WHERE NOT (faulted OR lapsed) ORDER BY position LIMIT 4`, o.sub, killed, frozen)
	if err != nil {
		return fail("unexcused duplicates", err)
	}
	type dup struct {
		id          string
		pos         int64
		worker      string
		first       time.Time
		slot        int
		deliveries  []string
		leases      []string
		checkpoints []string
		drains      []string
	}
	var dups []dup
	for rows.Next() {
		var d dup
		var id [16]byte
		if err := rows.Scan(&id, &d.pos, &d.worker, &d.first, &d.slot); err != nil {
			rows.Close()
			return fail("unexcused duplicates", err)
		}
		d.id = fmt.Sprintf("%x", id)
		dups = append(dups, d)
	}
	if err := rows.Err(); err != nil {
		return fail("unexcused duplicates", err)
	}
	for _, d := range dups {
		// From a few seconds before the first delivery to the last one.
		var apps []string
		var last time.Time
		err := o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT array_agg(DISTINCT app), max(at) FROM %s.obs_delivery_log
			WHERE subscription = $1 AND event_id = $2::uuid`, o.q), o.sub, d.id).Scan(&apps, &last)
		if err == nil {
			d.deliveries, err = o.texts(ctx, `SELECT format('%%s by %%s%%s', at, app, CASE WHEN first THEN ' (first)' END)
				FROM %[1]s.obs_delivery_log WHERE subscription = $1 AND event_id = $2::uuid ORDER BY at`, o.sub, d.id)
		}
		if err == nil {
			d.leases, err = o.texts(ctx, slotLeaseChanges, o.sub, d.slot, d.first.Add(-5*time.Second), last)
		}
		if err == nil {
			d.checkpoints, err = o.texts(ctx, slotCheckpointWrites, o.sub, d.slot, d.first.Add(-5*time.Second), last)
		}
		if err == nil {
			d.drains, err = o.texts(ctx, `SELECT format('%%s to %%s by %%s', r.at, r.cut, r.app)
				FROM %[1]s.obs_drain_log r WHERE r.subscription = $1 AND r.bucket = $2 ORDER BY r.at`, o.sub, d.slot)
		}
		if err != nil {
			return fail("the story of "+d.id, err)
		}
		fmt.Fprintf(&b, "\n--- event %s at %d, slot %d, first delivered by %s at %s\ndeliveries:\n  %s\nlease changes:\n  %s"+
			"\ncheckpoint writes:\n  %s\ndrains:\n  %s", d.id, d.pos, d.slot, d.worker, d.first,
			strings.Join(d.deliveries, "\n  "), strings.Join(d.leases, "\n  "), strings.Join(d.checkpoints, "\n  "),
			strings.Join(d.drains, "\n  "))
		// What the deliverers logged about the slot meanwhile, and their
		// warnings and errors.
		for _, app := range apps {
			b.WriteString(o.workerLog(app, "from 3 s before the first delivery to 1 s after the last",
				d.first.Add(-3*time.Second), last.Add(time.Second), d.slot))
		}
	}
	return b.String()
}
