package integration

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// report is what a scenario found, from the database.
type report struct {
	scenario string
	kind     string

	appended, handled, lost, duplicates int64
	// regressions: checkpoint writes that moved a checkpoint back (every
	// write is logged), plus decreases the poller saw.
	regressions int64
	// overlaps: changes of owner that took a lease which was still valid
	// by the database's clock without liveness evidence (the previous
	// owner's session lock held by the taker) and without its consent.
	overlaps int64
	// Takeovers by their justification.
	expired, evidence, consent int64
	// stale: deliveries recorded in the sink by a worker that did not own
	// the event's bucket at that moment (by the lease log).
	stale        int64
	staleByOwner map[string]int64 // "worker bucket" → stale deliveries
	// staleCheckpoints: checkpoint writes that landed while the writer did
	// not own the bucket (the fence must stop every one).
	staleCheckpoints int64
	// order: first deliveries of a stream out of version order, or with a
	// version missing before them.
	order int64
	// skippedWrites: checkpoint writes that moved a slot's checkpoint over
	// an event of the slot not handled at that moment (see skippedWrites);
	// skippedStory tells the first few.
	skippedWrites int64
	skippedStory  string
	// failovers: per fault, from the fault until every bucket the worker
	// held had another owner. convergences: per join, from the process
	// start until a fair split that includes it.
	failovers, convergences []time.Duration
	// maxUnowned: the longest a bucket was free (or lapsed) before its next
	// owner claimed it; maxMissed: the most passes its claimant began in
	// that time, while the bucket was free for it, without claiming it
	// (see missedPasses).
	maxUnowned time.Duration
	maxMissed  int
	extra      []string
}

// fault is a fault injected into one worker at a time.
type fault struct {
	worker string
	at     time.Time
}

// settle waits until every committed event of the category is sequenced
// and in the sink; false if the set of events still missing stops
// shrinking for stall (or the wait passes settleCap).
func (o *observer) settle(stall time.Duration) bool {
	q := fmt.Sprintf(`SELECT count(*) FILTER (WHERE position IS NULL),
		count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM %[1]s.sink s WHERE s.subscription = $2 AND s.event_id = e.event_id))
		FROM %[2]s e WHERE e.category = $1 AND e.event_id <> ALL($3::uuid[])`, o.q, eventsWithPositions(o.q))
	// The wait is progress-based: a drain that keeps shrinking the
	// missing set may take as long as a loaded machine needs (up to
	// settleCap), but one that makes no progress for stall fails. A
	// throughput-bound scenario (a single-connection pool writing every
	// delivery in a transaction, under -race beside other packages)
	// drains slowly; a lost event stops the count for good.
	start := time.Now()
	lastProgress := start
	best := int64(-1)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var unsequenced, missing int64
		err := o.pool.QueryRow(ctx, q, o.cat, o.sub, o.excusedIDs()).Scan(&unsequenced, &missing)
		cancel()
		if err == nil && unsequenced == 0 && missing == 0 {
			return true
		}
		if err == nil && (best < 0 || unsequenced+missing < best) {
			best = unsequenced + missing
			lastProgress = time.Now()
		}
		if now := time.Now(); now.Sub(lastProgress) > stall || now.Sub(start) > settleCap {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settleCap bounds a settle that keeps making progress.
const settleCap = 10 * time.Minute

type transition struct {
	bucket                int
	oldOwner, newOwner    string
	oldExpires, txNow, at time.Time
	// committed is when the change's transaction committed (from
	// track_commit_timestamp, which internal/pgtest turns on); zero when
	// the server does not record it.
	committed time.Time
	evidence  bool
	// xid is the change's transaction; claim and claimedAt the two-phase
	// claim the row carries after the change ("" for none).
	xid       uint64
	claim     string
	claimedAt time.Time
}

// claimChange is a change of a bucket's two-phase claim that did not
// change its owner (obs_claim_log).
type claimChange struct {
	at        time.Time
	claim     string // the claim after the change, "" when withdrawn
	claimedAt time.Time
	xid       uint64
}

// pass is one pass of a worker, as its heartbeat logged it.
type pass struct {
	at      time.Time // heartbeat_at: the pass's now(), its transaction's start
	snap    snapshot  // taken as its heartbeat statement ended, before its claims
	expires time.Time // the worker row's expiry after it
	logged  time.Time // when the heartbeat statement ran (clock_timestamp)
}

// snapshot is a pg_snapshot: the transactions a statement saw committed.
type snapshot struct {
	xmin, xmax uint64
	xip        []uint64 // in progress
}

// parseSnapshot reads a pg_snapshot's text form, xmin:xmax:xip,xip,...
func parseSnapshot(text string) (snapshot, error) {
	parts := strings.Split(text, ":")
	if len(parts) != 3 {
		return snapshot{}, fmt.Errorf("snapshot %q: not xmin:xmax:xip", text)
	}
	var s snapshot
	var err error
	if s.xmin, err = strconv.ParseUint(parts[0], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("snapshot %q: %w", text, err)
	}
	if s.xmax, err = strconv.ParseUint(parts[1], 10, 64); err != nil {
		return snapshot{}, fmt.Errorf("snapshot %q: %w", text, err)
	}
	for _, x := range strings.Split(parts[2], ",") {
		if x == "" {
			continue
		}
		id, err := strconv.ParseUint(x, 10, 64)
		if err != nil {
			return snapshot{}, fmt.Errorf("snapshot %q: %w", text, err)
		}
		s.xip = append(s.xip, id)
	}
	return s, nil
}

// sees reports whether the committed transaction xid is visible in s
// (pg_visible_in_snapshot).
func (s snapshot) sees(xid uint64) bool {
	return xid < s.xmin || (xid < s.xmax && !slices.Contains(s.xip, xid))
}

// collect reads the logs into a report.
func (o *observer) collect(scenario, kind string, faults []fault) report {
	o.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := report{scenario: scenario, kind: kind, staleByOwner: map[string]int64{}}
	must := func(err error, what string) {
		if err != nil {
			o.t.Fatalf("observer: %s: %v", what, err)
		}
	}
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.events WHERE category = $1`, o.q), o.cat).
		Scan(&r.appended), "appended")
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), coalesce(sum(deliveries - 1), 0) FROM %s.sink
		WHERE subscription = $1`, o.q), o.sub).Scan(&r.handled, &r.duplicates), "handled")
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.events e WHERE e.category = $1
		AND NOT EXISTS (SELECT 1 FROM %[1]s.sink s WHERE s.subscription = $2 AND s.event_id = e.event_id)
		AND e.event_id <> ALL($3::uuid[])`, o.q),
		o.cat, o.sub, o.excusedIDs()).Scan(&r.lost), "lost")
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.obs_checkpoint_log
		WHERE subscription = $1 AND new_position < old_position`, o.q), o.sub).Scan(&r.regressions), "regressions")
	o.mu.Lock()
	r.regressions += int64(len(o.regressions))
	o.mu.Unlock()
	// A gap of excused (dead-lettered) events only is in order.
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (
		SELECT stream, version, coalesce(lag(version) OVER (PARTITION BY stream ORDER BY id), -1) AS prev
		FROM %[1]s.obs_delivery_log WHERE subscription = $1 AND first) x
		WHERE version - prev - 1 <> (SELECT count(*) FROM %[1]s.events e WHERE e.stream_name = x.stream
			AND e.version > x.prev AND e.version < x.version AND e.event_id = ANY($2::uuid[]))`, o.q),
		o.sub, o.excusedIDs()).Scan(&r.order), "order")

	// An event's bucket is its slot in the generation whose positions
	// hold it (docs/design/resize.md): generation 0 until a resize's cut, the
	// next one after it.
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`WITH d AS (
		SELECT d.app, d.at, coalesce(g.generation, 0) * 65536 + %[1]s.cg_bucket(e.cg_hash, coalesce(g.bucket_count, $2)) AS slot
		FROM %[1]s.obs_delivery_log d
		JOIN `+eventsWithPositions(o.q)+` e ON e.event_id = d.event_id
		LEFT JOIN LATERAL (
			SELECT g.generation, g.bucket_count FROM %[1]s.generations g
			WHERE g.subscription = d.subscription AND e.position > coalesce(g.start_after, 0)
				AND (g.end_at IS NULL OR e.position <= g.end_at)
			ORDER BY g.generation LIMIT 1) g ON true
		WHERE d.subscription = $1)
		SELECT d.app, d.slot, count(*) FROM d
		LEFT JOIN LATERAL (
			SELECT l.new_owner FROM %[1]s.obs_lease_log l
			WHERE l.subscription = $1 AND l.bucket = d.slot AND l.at <= d.at
			ORDER BY l.at DESC LIMIT 1) o ON true
		WHERE o.new_owner IS DISTINCT FROM d.app
		GROUP BY 1, 2`, o.q), o.sub, o.n)
	must(err, "stale")
	for rows.Next() {
		var app string
		var b int
		var n int64
		must(rows.Scan(&app, &b, &n), "stale")
		r.stale += n
		r.staleByOwner[fmt.Sprintf("%s b%d", app, b)] = n
	}
	must(rows.Err(), "stale")

	// A resize's cut writes the next generation's checkpoints at C,
	// by the worker whose proposal decided it (docs/design/resize.md, the cut):
	// not a holder's write.
	must(o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %[1]s.obs_checkpoint_log c
		LEFT JOIN LATERAL (
			SELECT l.new_owner FROM %[1]s.obs_lease_log l
			WHERE l.subscription = c.subscription AND l.bucket = c.bucket AND l.at <= c.at
			ORDER BY l.at DESC LIMIT 1) o ON true
		WHERE c.subscription = $1 AND o.new_owner IS DISTINCT FROM c.app
			AND NOT EXISTS (SELECT 1 FROM %[1]s.generations g WHERE g.subscription = c.subscription
				AND g.generation = c.bucket / 65536 AND g.generation > 0 AND g.start_after = c.new_position)`, o.q), o.sub).Scan(&r.staleCheckpoints),
		"stale checkpoints")

	crossings, err := o.skippedWrites(ctx)
	must(err, "skipped writes")
	r.skippedWrites = int64(len(crossings))
	if len(crossings) > 0 {
		r.skippedStory = o.skippedStory(ctx, crossings)
	}

	trs := o.transitions(ctx)
	for _, tr := range trs {
		switch {
		case tr.newOwner == "" || tr.oldOwner == tr.newOwner:
		case tr.oldOwner == "":
			r.consent++ // from a release or a handover
		case tr.evidence:
			r.evidence++
		case tr.oldExpires.Before(tr.txNow):
			r.expired++
		default:
			r.overlaps++
		}
	}
	passes := o.passes(ctx)
	claims := o.claimChanges(ctx)
	byBucket := map[int][]transition{}
	for _, tr := range trs {
		byBucket[tr.bucket] = append(byBucket[tr.bucket], tr)
	}
	for b, list := range byBucket {
		for i, tr := range list {
			if tr.newOwner == "" || i == 0 {
				continue
			}
			// The bucket was unowned from the release before it, or from
			// the expiry of the lease it took.
			var from time.Time
			switch prev := list[i-1]; {
			case tr.oldOwner == "" && prev.newOwner == "":
				// Unowned once the release committed.
				from = prev.at
				if prev.committed.After(from) {
					from = prev.committed
				}
			case tr.oldOwner != "" && !tr.evidence && tr.oldExpires.Before(tr.txNow):
				from = tr.oldExpires
			default:
				continue
			}
			r.maxUnowned = max(r.maxUnowned, tr.at.Sub(from))
			r.maxMissed = max(r.maxMissed, o.missedPasses(list[i-1], tr, claims[b], passes))
		}
	}
	for _, f := range faults {
		if d, ok := failover(byBucket, f); ok {
			r.failovers = append(r.failovers, d)
		} else {
			r.extra = append(r.extra, "no-failover:"+f.worker)
		}
	}
	return r
}

// failover returns how long after f every bucket its worker held had
// another owner; false if one never did.
func failover(byBucket map[int][]transition, f fault) (time.Duration, bool) {
	var worst time.Duration
	held := 0
	for _, list := range byBucket {
		owner := ""
		i := 0
		for ; i < len(list) && !list[i].at.After(f.at); i++ {
			owner = list[i].newOwner
		}
		if owner != f.worker {
			continue
		}
		held++
		moved := false
		for ; i < len(list); i++ {
			if list[i].newOwner != "" && list[i].newOwner != f.worker {
				worst = max(worst, list[i].at.Sub(f.at))
				moved = true
				break
			}
		}
		if !moved {
			return 0, false
		}
	}
	return worst, held > 0
}

func (o *observer) transitions(ctx context.Context) []transition {
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT bucket, coalesce(old_owner, ''), coalesce(new_owner, ''),
		old_expires, tx_now, at, evidence,
		CASE WHEN current_setting('track_commit_timestamp') = 'on' THEN pg_xact_commit_timestamp(xmin) END,
		xid::text, coalesce(claim, ''), claimed_at
		FROM %s.obs_lease_log WHERE subscription = $1 ORDER BY bucket, id`, o.q), o.sub)
	if err != nil {
		o.t.Fatalf("observer: lease log: %v", err)
	}
	trs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (transition, error) {
		var tr transition
		var oldExp, committed, claimedAt *time.Time
		var xid string
		err := r.Scan(&tr.bucket, &tr.oldOwner, &tr.newOwner, &oldExp, &tr.txNow, &tr.at, &tr.evidence, &committed,
			&xid, &tr.claim, &claimedAt)
		if err != nil {
			return tr, err
		}
		if oldExp != nil {
			tr.oldExpires = *oldExp
		}
		if committed != nil {
			tr.committed = *committed
		}
		if claimedAt != nil {
			tr.claimedAt = *claimedAt
		}
		tr.xid, err = strconv.ParseUint(xid, 10, 64)
		return tr, err
	})
	if err != nil {
		o.t.Fatalf("observer: lease log: %v", err)
	}
	return trs
}

// claimChanges returns, by bucket and in order, the changes of claims
// that did not change the owner.
func (o *observer) claimChanges(ctx context.Context) map[int][]claimChange {
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT bucket, at, coalesce(new_claim, ''), claimed_at, xid::text
		FROM %s.obs_claim_log WHERE subscription = $1 ORDER BY bucket, at`, o.q), o.sub)
	if err != nil {
		o.t.Fatalf("observer: claim log: %v", err)
	}
	out := map[int][]claimChange{}
	var b int
	var c claimChange
	var claimedAt *time.Time
	var xid string
	_, err = pgx.ForEachRow(rows, []any{&b, &c.at, &c.claim, &claimedAt, &xid}, func() error {
		c.claimedAt = time.Time{}
		if claimedAt != nil {
			c.claimedAt = *claimedAt
		}
		var err error
		c.xid, err = strconv.ParseUint(xid, 10, 64)
		out[b] = append(out[b], c)
		return err
	})
	if err != nil {
		o.t.Fatalf("observer: claim log: %v", err)
	}
	return out
}

// passes returns every pass each worker completed (its worker
// heartbeats), in order. A worker's first heartbeat is no pass: it is its
// leasestore Store.Start, which registers the worker (and so counts it in
// the others' fair share) before its first pass, and claims nothing.
func (o *observer) passes(ctx context.Context) map[string][]pass {
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT worker, heartbeat_at, snap::text, expires_at, at FROM %s.obs_worker_log
		WHERE subscription = $1 AND op <> 'DELETE' ORDER BY id`, o.q), o.sub)
	if err != nil {
		o.t.Fatalf("observer: worker log: %v", err)
	}
	// Each worker's heartbeats in order: its join, then its passes.
	out := map[string][]pass{}
	var w, snap string
	var p pass
	_, err = pgx.ForEachRow(rows, []any{&w, &p.at, &snap, &p.expires, &p.logged}, func() error {
		// Another worker's change of the row (a session worker's death
		// marked by confirm_dead) keeps its heartbeat: not a pass.
		if l := out[w]; len(l) > 0 && !p.at.After(l[len(l)-1].at) {
			return nil
		}
		var err error
		p.snap, err = parseSnapshot(snap)
		out[w] = append(out[w], p)
		return err
	})
	if err != nil {
		o.t.Fatalf("observer: worker log: %v", err)
	}
	for w, l := range out {
		out[w] = l[1:]
	}
	return out
}

// missedPasses counts the passes tr's new owner began while the bucket
// was free for it, before the pass that claimed it: passes that could
// have claimed it and did not (a claim skips a row that another
// transaction holds locked, for one). prev is the bucket's change before
// tr, claims the bucket's claim changes, passes every worker's passes.
//
// The bucket is free for the new owner in a pass when
//   - it is unowned: the pass's snapshot (taken as its heartbeat statement
//     ends, before any claim) sees the release (prev) committed — not the
//     pass's clock: a commit's timestamp comes before other sessions see
//     the commit, and a transaction's now() before its statements'
//     snapshots — or the old lease had expired by the pass's now(), by
//     which the claim judges expiry;
//   - and no other worker's two-phase claim holds it. A release or a
//     handover leaves the claim on the row, and only its claimant may
//     take the bucket, until the claim is withdrawn — by the claimant's
//     pass once above its fair share, or its Leave: the pass's snapshot
//     sees the withdrawal — or lapses: its claimant is no longer live, or
//     the claim is older than claimStale, by the pass's now().
func (o *observer) missedPasses(prev, tr transition, claims []claimChange, passes map[string][]pass) int {
	me := tr.newOwner
	released := tr.oldOwner == ""
	// The claim the row carried when the claim was taken: the one the
	// change before left on it, as changed since; and the last withdrawal
	// of another worker's claim.
	claim, claimedAt := prev.claim, prev.claimedAt
	var cleared uint64
	for _, c := range claims {
		if !c.at.After(prev.at) || !c.at.Before(tr.at) {
			continue
		}
		if claim != "" && claim != me && (c.claim == "" || c.claim == me) {
			cleared = c.xid
		}
		claim, claimedAt = c.claim, c.claimedAt
	}
	var lapsed time.Time // when another worker's claim stopped holding
	if claim != "" && claim != me {
		lapsed = o.expiryBefore(claim, tr.at, passes)
		if o.claimStale > 0 && !claimedAt.IsZero() {
			lapsed = minTime(lapsed, claimedAt.Add(o.claimStale))
		}
	}
	missed := 0
	for _, p := range passes[me] {
		switch {
		case !p.at.Before(tr.txNow): // the claiming pass, and later ones
		case released && !p.snap.sees(prev.xid):
		case !released && !p.at.After(tr.oldExpires):
		case cleared != 0 && !p.snap.sees(cleared):
		case !lapsed.IsZero() && !p.at.After(lapsed):
		default:
			missed++
		}
	}
	return missed
}

// expiryBefore returns worker's expiry as its last pass logged before t
// left it (zero if it logged none): a claim of a worker no longer live by
// a pass's now() does not hold.
func (o *observer) expiryBefore(worker string, t time.Time, passes map[string][]pass) time.Time {
	var exp time.Time
	for _, p := range passes[worker] {
		if p.logged.Before(t) {
			exp = maxTime(exp, p.expires)
		}
	}
	return exp
}

func minTime(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// line is the scenario's one summary line.
func (r report) line() string {
	var b strings.Builder
	fmt.Fprintf(&b, "SUMMARY %s form=%s", r.scenario, form())
	if r.kind != "" {
		fmt.Fprintf(&b, " lease=%s", r.kind)
	}
	fmt.Fprintf(&b, " appended=%d handled=%d lost=%d duplicates=%d regressions=%d overlaps=%d stale=%d stale_checkpoints=%d order=%d skipped_writes=%d",
		r.appended, r.handled, r.lost, r.duplicates, r.regressions, r.overlaps, r.stale, r.staleCheckpoints, r.order, r.skippedWrites)
	fmt.Fprintf(&b, " takeovers(expired/evidence/consent)=%d/%d/%d", r.expired, r.evidence, r.consent)
	fmt.Fprintf(&b, " failover_p50=%s failover_max=%s (n=%d)", pct(r.failovers, 50), pct(r.failovers, 100), len(r.failovers))
	fmt.Fprintf(&b, " convergence_p50=%s convergence_max=%s (n=%d)", pct(r.convergences, 50), pct(r.convergences, 100), len(r.convergences))
	fmt.Fprintf(&b, " max_unowned=%s max_missed_passes=%d", round(r.maxUnowned), r.maxMissed)
	for _, e := range r.extra {
		b.WriteString(" " + e)
	}
	return b.String()
}

// pct is the p-th percentile (nearest rank) of ds, "-" when empty.
func pct(ds []time.Duration, p int) string {
	if len(ds) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	i := (p*len(s)+99)/100 - 1
	return round(s[max(0, min(i, len(s)-1))]).String()
}

func round(d time.Duration) time.Duration {
	if d > time.Second {
		return d.Round(10 * time.Millisecond)
	}
	return d.Round(time.Millisecond)
}

// lostStory describes, for a failure message, the first few events that
// never reached the sink: each one's stream, version and position, and for
// every generation of the subscription the slot it belongs to there, that
// slot's checkpoint writes that crossed its position (who moved the
// checkpoint over it), the slot's drains and its lease changes.
func (o *observer) lostStory() string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var b strings.Builder
	type lostEvent struct {
		id      string
		stream  string
		version int64
		pos     *int64
		hash    int64
		written time.Time
	}
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT e.event_id::text, e.stream_name, e.version, e.position, e.cg_hash, e.recorded_at
		FROM `+eventsWithPositions(o.q)+` e WHERE e.category = $1
			AND NOT EXISTS (SELECT 1 FROM %[1]s.sink s WHERE s.subscription = $2 AND s.event_id = e.event_id)
			AND e.event_id <> ALL($3::uuid[])
		ORDER BY e.position NULLS FIRST LIMIT 5`, o.q), o.cat, o.sub, o.excusedIDs())
	if err != nil {
		return "lost events: " + err.Error()
	}
	var lost []lostEvent
	for rows.Next() {
		var l lostEvent
		if err := rows.Scan(&l.id, &l.stream, &l.version, &l.pos, &l.hash, &l.written); err != nil {
			rows.Close()
			return "lost events: " + err.Error()
		}
		lost = append(lost, l)
	}
	rows.Close()
	lines := func(title, query string, args ...any) {
		rows, err := o.pool.Query(ctx, fmt.Sprintf(query, o.q), args...)
		if err != nil {
			fmt.Fprintf(&b, "\n  %s: %v", title, err)
			return
		}
		defer rows.Close()
		fmt.Fprintf(&b, "\n  %s:", title)
		for rows.Next() {
			var l string
			if err := rows.Scan(&l); err != nil {
				fmt.Fprintf(&b, " %v", err)
				return
			}
			b.WriteString("\n    " + l)
		}
	}
	for _, l := range lost {
		pos := int64(-1)
		if l.pos != nil {
			pos = *l.pos
		}
		fmt.Fprintf(&b, "\n--- lost event %s: %s version %d, position %d (-1: none), recorded %s", l.id, l.stream, l.version, pos,
			l.written.Format(time.StampMicro))
		lines("its slot per generation (generation, buckets, start_after, end_at, slot)", `SELECT format('%%s %%s (%%s, %%s] slot %%s',
				g.generation, g.bucket_count, g.start_after, g.end_at, g.generation * 65536 + %[1]s.cg_bucket($2, g.bucket_count))
			FROM %[1]s.generations g WHERE g.subscription = $1 ORDER BY g.generation`, o.sub, l.hash)
		lines("checkpoint writes of those slots that crossed it", `SELECT format('%%s slot %%s: %%s → %%s by %%s', c.at, c.bucket, c.old_position, c.new_position, c.app)
			FROM %[1]s.obs_checkpoint_log c JOIN %[1]s.generations g ON g.subscription = c.subscription
				AND c.bucket = g.generation * 65536 + %[1]s.cg_bucket($2, g.bucket_count)
			WHERE c.subscription = $1 AND coalesce(c.old_position, -1) < $3 AND c.new_position >= $3 ORDER BY c.at`, o.sub, l.hash, pos)
		lines("drains of those slots", `SELECT format('%%s slot %%s to %%s by %%s', r.at, r.bucket, r.cut, r.app)
			FROM %[1]s.obs_drain_log r JOIN %[1]s.generations g ON g.subscription = r.subscription
				AND r.bucket = g.generation * 65536 + %[1]s.cg_bucket($2, g.bucket_count)
			WHERE r.subscription = $1 ORDER BY r.at`, o.sub, l.hash)
		lines("its dead letters", `SELECT format('generation %%s bucket %%s attempts %%s at %%s replayed %%s: %%s', d.generation, d.bucket,
				d.attempts, d.created_at, d.replayed_at, d.reason)
			FROM %[1]s.dead_letters d WHERE d.subscription = $1 AND d.event_id = $2::uuid`, o.sub, l.id)
		lines("its slots' checkpoints and leases now", `SELECT format('slot %%s: checkpoint %%s, owner %%s@%%s', s.slot,
				(SELECT c.position FROM %[1]s.checkpoints c WHERE c.subscription = $1 AND c.bucket = s.slot),
				b.owner, b.epoch)
			FROM (SELECT g.generation * 65536 + %[1]s.cg_bucket($2, g.bucket_count) AS slot
				FROM %[1]s.generations g WHERE g.subscription = $1) s
			LEFT JOIN %[1]s.lease_buckets b ON b.subscription = $1 AND b.bucket = s.slot ORDER BY s.slot`, o.sub, l.hash)
		lines("the sequencer", `SELECT format('last_position %%s low_seq %%s; the event''s append: seq %%s, last_position %%s',
				q.last_position, q.low_seq, a.seq, a.last_position)
			FROM %[1]s.sequencer q, %[1]s.appends a JOIN %[1]s.events e ON e.seq = a.seq WHERE q.id = 1 AND e.event_id = $1::uuid`, l.id)
		lines("deliveries of its stream around it", `SELECT format('%%s v%%s at %%s by %%s%%s', d.at, d.version, d.position, d.app, CASE WHEN d.first THEN '' ELSE ' (again)' END)
			FROM %[1]s.obs_delivery_log d WHERE d.subscription = $1 AND d.stream = $2 AND d.version BETWEEN $3 - 2 AND $3 + 2
			ORDER BY d.at`, o.sub, l.stream, l.version)
		// What the owners of its slots and the writers of the checkpoints
		// that crossed it logged about those slots since it was recorded.
		rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT DISTINCT w.app, w.slot FROM (
				SELECT b.owner AS app, b.bucket AS slot FROM %[1]s.generations g JOIN %[1]s.lease_buckets b
					ON b.subscription = g.subscription AND b.bucket = g.generation * 65536 + %[1]s.cg_bucket($2, g.bucket_count)
				WHERE g.subscription = $1 AND b.owner IS NOT NULL
				UNION SELECT c.app, c.bucket FROM %[1]s.obs_checkpoint_log c JOIN %[1]s.generations g ON g.subscription = c.subscription
					AND c.bucket = g.generation * 65536 + %[1]s.cg_bucket($2, g.bucket_count)
				WHERE c.subscription = $1 AND coalesce(c.old_position, -1) < $3 AND c.new_position >= $3 AND c.app IS NOT NULL) w
			ORDER BY 1, 2`, o.q), o.sub, l.hash, pos)
		if err != nil {
			fmt.Fprintf(&b, "\n  its slots' owners and writers: %v", err)
			continue
		}
		var app string
		var slot int
		_, err = pgx.ForEachRow(rows, []any{&app, &slot}, func() error {
			if o.statusOf != nil {
				fmt.Fprintf(&b, "\n%s's /status of slot %d: %s", app, slot, o.statusOf(app, slot))
			}
			b.WriteString(o.workerLog(app, fmt.Sprintf("about slot %d from 3 s before the event was recorded to now", slot),
				l.written.Add(-3*time.Second), time.Now(), slot))
			return nil
		})
		if err != nil {
			fmt.Fprintf(&b, "\n  its slots' owners and writers: %v", err)
		}
	}
	return b.String()
}
