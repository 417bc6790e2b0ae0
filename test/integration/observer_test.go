package integration

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/worker"
	"github.com/kumi-run/kumi/leasestore"
)

// The observer sees the run only through the database. Triggers installed
// in the scenario's schema log, in the writer's own transaction (so a
// rolled-back or fenced-out write leaves no trace),
//
//   - every change of a bucket's owner or epoch, with the previous owner's
//     expiry, the taker's now(), whether the taker holds the previous
//     owner's session lock (liveness evidence), the claim the row carries
//     after the change, and the writing transaction's id — obs_lease_log;
//   - every other change of a bucket's two-phase claim (placed, withdrawn,
//     recovered), with the writing transaction's id — obs_claim_log;
//   - every worker heartbeat — a worker's registration as its store
//     starts, then every pass it completes — with a snapshot taken as the
//     heartbeat statement ends, before any claim of the pass (which
//     transactions it saw committed) — obs_worker_log;
//   - every checkpoint write, old and new value — obs_checkpoint_log;
//   - every delivery the sink records, first or duplicate, and by whose
//     session (application_name is the worker id) — obs_delivery_log;
//   - every dead-lettering of an event — obs_dead_letter_log (a letter
//     written again moves its created_at on: the log keeps the first);
//   - every old bucket's drain during a resize (docs/design/resize.md), with the
//     cut it drained to — obs_drain_log; and every change of the
//     subscription's generation and resize state — obs_subscription_log;
//
// and a poller reads the lease and checkpoint tables every few
// milliseconds, for the fair-split waits and as a second regression check.
const observerDDL = `
CREATE TABLE IF NOT EXISTS {{s}}.obs_lease_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, bucket int NOT NULL,
    old_owner text, new_owner text, old_epoch bigint, new_epoch bigint,
    old_expires timestamptz, tx_now timestamptz NOT NULL, at timestamptz NOT NULL,
    evidence boolean NOT NULL, app text, xid xid8 NOT NULL, claim text, claimed_at timestamptz);
CREATE INDEX IF NOT EXISTS obs_lease_log_bucket ON {{s}}.obs_lease_log (subscription, bucket, at);
CREATE OR REPLACE FUNCTION {{s}}.obs_lease() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_lease_log (subscription, bucket, old_owner, new_owner, old_epoch, new_epoch,
        old_expires, tx_now, at, evidence, app, xid, claim, claimed_at)
    VALUES (NEW.subscription, NEW.bucket, OLD.owner, NEW.owner, OLD.epoch, NEW.epoch,
        OLD.expires_at, now(), clock_timestamp(),
        OLD.owner IS NOT NULL AND NEW.owner IS NOT NULL AND EXISTS (
            SELECT 1 FROM {{s}}.lease_workers m
            JOIN pg_locks l ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                AND l.pid = pg_backend_pid()
                AND l.classid = ((m.lock_key >> 32) & 4294967295)::oid
                AND l.objid = (m.lock_key & 4294967295)::oid
            WHERE m.subscription = NEW.subscription AND m.worker = OLD.owner AND m.lock_key IS NOT NULL),
        current_setting('application_name'), pg_current_xact_id(), NEW.claim_worker, NEW.claimed_at);
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_lease ON {{s}}.lease_buckets;
CREATE TRIGGER obs_lease AFTER UPDATE ON {{s}}.lease_buckets FOR EACH ROW
    WHEN (OLD.owner IS DISTINCT FROM NEW.owner OR OLD.epoch IS DISTINCT FROM NEW.epoch)
    EXECUTE FUNCTION {{s}}.obs_lease();

CREATE TABLE IF NOT EXISTS {{s}}.obs_claim_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, bucket int NOT NULL, owner text,
    old_claim text, new_claim text, claimed_at timestamptz, at timestamptz NOT NULL, xid xid8 NOT NULL, app text);
CREATE INDEX IF NOT EXISTS obs_claim_log_bucket ON {{s}}.obs_claim_log (subscription, bucket, at);
CREATE OR REPLACE FUNCTION {{s}}.obs_claim() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_claim_log (subscription, bucket, owner, old_claim, new_claim, claimed_at, at, xid, app)
    VALUES (NEW.subscription, NEW.bucket, NEW.owner, OLD.claim_worker, NEW.claim_worker, NEW.claimed_at,
        clock_timestamp(), pg_current_xact_id(), current_setting('application_name'));
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_claim ON {{s}}.lease_buckets;
CREATE TRIGGER obs_claim AFTER UPDATE ON {{s}}.lease_buckets FOR EACH ROW
    WHEN (OLD.claim_worker IS DISTINCT FROM NEW.claim_worker
        AND OLD.owner IS NOT DISTINCT FROM NEW.owner AND OLD.epoch IS NOT DISTINCT FROM NEW.epoch)
    EXECUTE FUNCTION {{s}}.obs_claim();

CREATE TABLE IF NOT EXISTS {{s}}.obs_worker_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, worker text NOT NULL, op text NOT NULL,
    heartbeat_at timestamptz, expires_at timestamptz, at timestamptz NOT NULL, snap pg_snapshot);
CREATE OR REPLACE FUNCTION {{s}}.obs_worker() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO {{s}}.obs_worker_log (subscription, worker, op, heartbeat_at, expires_at, at)
        VALUES (OLD.subscription, OLD.worker, TG_OP, OLD.heartbeat_at, OLD.expires_at, clock_timestamp());
    ELSE
        INSERT INTO {{s}}.obs_worker_log (subscription, worker, op, heartbeat_at, expires_at, at, snap)
        VALUES (NEW.subscription, NEW.worker, TG_OP, NEW.heartbeat_at, NEW.expires_at, clock_timestamp(),
            pg_current_snapshot());
    END IF;
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_worker ON {{s}}.lease_workers;
CREATE TRIGGER obs_worker AFTER INSERT OR UPDATE OR DELETE ON {{s}}.lease_workers FOR EACH ROW
    EXECUTE FUNCTION {{s}}.obs_worker();

CREATE TABLE IF NOT EXISTS {{s}}.obs_checkpoint_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, bucket int NOT NULL,
    old_position bigint, new_position bigint NOT NULL, at timestamptz NOT NULL, app text);
CREATE OR REPLACE FUNCTION {{s}}.obs_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_checkpoint_log (subscription, bucket, old_position, new_position, at, app)
    VALUES (NEW.subscription, NEW.bucket, CASE WHEN TG_OP = 'UPDATE' THEN OLD.position END,
        NEW.position, clock_timestamp(), current_setting('application_name'));
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_checkpoint ON {{s}}.checkpoints;
CREATE TRIGGER obs_checkpoint AFTER INSERT OR UPDATE ON {{s}}.checkpoints FOR EACH ROW
    EXECUTE FUNCTION {{s}}.obs_checkpoint();

CREATE TABLE IF NOT EXISTS {{s}}.obs_delivery_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, event_id uuid NOT NULL, stream text NOT NULL,
    version bigint NOT NULL, position bigint NOT NULL, first boolean NOT NULL,
    at timestamptz NOT NULL, app text);
CREATE OR REPLACE FUNCTION {{s}}.obs_delivery() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_delivery_log (subscription, event_id, stream, version, position, first, at, app)
    VALUES (NEW.subscription, NEW.event_id, NEW.stream, NEW.version, NEW.position, TG_OP = 'INSERT',
        clock_timestamp(), current_setting('application_name'));
    RETURN NULL;
END $f$;
CREATE INDEX IF NOT EXISTS obs_delivery_log_event ON {{s}}.obs_delivery_log (subscription, event_id, at);
DROP TRIGGER IF EXISTS obs_delivery ON {{s}}.sink;
CREATE TRIGGER obs_delivery AFTER INSERT OR UPDATE ON {{s}}.sink FOR EACH ROW
    EXECUTE FUNCTION {{s}}.obs_delivery();

CREATE TABLE IF NOT EXISTS {{s}}.obs_dead_letter_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, event_id uuid NOT NULL, at timestamptz NOT NULL, app text);
CREATE INDEX IF NOT EXISTS obs_dead_letter_log_event ON {{s}}.obs_dead_letter_log (subscription, event_id, at);
CREATE OR REPLACE FUNCTION {{s}}.obs_dead_letter() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_dead_letter_log (subscription, event_id, at, app)
    VALUES (NEW.subscription, NEW.event_id, clock_timestamp(), current_setting('application_name'));
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_dead_letter ON {{s}}.dead_letters;
CREATE TRIGGER obs_dead_letter AFTER INSERT OR UPDATE ON {{s}}.dead_letters FOR EACH ROW
    EXECUTE FUNCTION {{s}}.obs_dead_letter();

CREATE TABLE IF NOT EXISTS {{s}}.obs_drain_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, bucket int NOT NULL, generation int NOT NULL,
    cut bigint, at timestamptz NOT NULL, app text);
CREATE OR REPLACE FUNCTION {{s}}.obs_drain() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_drain_log (subscription, bucket, generation, cut, at, app)
    VALUES (NEW.subscription, NEW.bucket, NEW.generation, NEW.cut, clock_timestamp(),
        current_setting('application_name'));
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_drain ON {{s}}.lease_buckets;
CREATE TRIGGER obs_drain AFTER UPDATE ON {{s}}.lease_buckets FOR EACH ROW
    WHEN (OLD.drained_at IS NULL AND NEW.drained_at IS NOT NULL)
    EXECUTE FUNCTION {{s}}.obs_drain();

CREATE TABLE IF NOT EXISTS {{s}}.obs_subscription_log (
    id bigserial PRIMARY KEY,
    subscription text NOT NULL, generation int NOT NULL, bucket_count int NOT NULL,
    state text NOT NULL, next_bucket_count int, cut bigint, at timestamptz NOT NULL, app text);
CREATE OR REPLACE FUNCTION {{s}}.obs_subscription() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    INSERT INTO {{s}}.obs_subscription_log (subscription, generation, bucket_count, state, next_bucket_count, cut, at, app)
    VALUES (NEW.subscription, NEW.generation, NEW.bucket_count, NEW.state, NEW.next_bucket_count, NEW.cut,
        clock_timestamp(), current_setting('application_name'));
    RETURN NULL;
END $f$;
DROP TRIGGER IF EXISTS obs_subscription ON {{s}}.subscriptions;
CREATE TRIGGER obs_subscription AFTER INSERT OR UPDATE ON {{s}}.subscriptions FOR EACH ROW
    EXECUTE FUNCTION {{s}}.obs_subscription();
`

// prepareSchema migrates the event store and lease tables, creates the
// workers' sink table and installs the observer's logs.
func prepareSchema(ctx context.Context, pool *pgxpool.Pool, schema string) error {
	if err := eventsource.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if err := leasestore.Migrate(ctx, pool, schema); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, worker.SinkDDL(schema)); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, strings.ReplaceAll(observerDDL, "{{s}}", pgx.Identifier{schema}.Sanitize()))
	return err
}

// sample is one read of the lease table: the serving generation's buckets.
type sample struct {
	at         time.Time // the database's clock_timestamp() of the read
	generation int       // the serving generation (0 until a resize completes)
	owner      []string  // by bucket of the serving generation; "" when free or expired
	checked    bool      // the read succeeded
}

// observer polls the lease and checkpoint tables and, at the end, reads
// the logs into a report.
type observer struct {
	t        testing.TB
	pool     *pgxpool.Pool
	q        string
	sub, cat string
	n        int
	// logOf returns the path of a worker's log, "" if unknown (set by
	// newEnv; the failure reports quote the logs).
	logOf func(worker string) string
	// statusOf returns the /status entry of slot in the running worker's
	// page, or why there is none (set by newEnv).
	statusOf func(worker string, slot int) string
	// claimStale is the age at which the workers' passes take a two-phase
	// claim for stale (2 × TTL; set by newEnv, 0 when unknown).
	claimStale time.Duration

	mu          sync.Mutex
	last        sample
	seq         int
	cpSeen      map[int]int64
	regressions []string
	excused     []uuid.UUID // events a scenario expects dead-lettered (see excuse)
	pollErrors  int
	cond        *sync.Cond

	cancel context.CancelFunc
	done   chan struct{}
}

func newObserver(t testing.TB, url, schema, sub, cat string, n int, every time.Duration) *observer {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("observer: %v", err)
	}
	cfg.MaxConns = 4
	cfg.ConnConfig.RuntimeParams["application_name"] = "observer"
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("observer: %v", err)
	}
	o := &observer{t: t, pool: pool, q: pgx.Identifier{schema}.Sanitize(), sub: sub, cat: cat, n: n,
		cpSeen: map[int]int64{}, done: make(chan struct{})}
	o.cond = sync.NewCond(&o.mu)
	ctx, cancel := context.WithCancel(context.Background())
	o.cancel = cancel
	go o.poll(ctx, every)
	t.Cleanup(func() { o.close(); pool.Close() })
	return o
}

// excuse tells the observer that a scenario expects the event to be
// dead-lettered rather than handled: it is not waited for, nor counted
// lost. The scenario checks its dead letter itself.
func (o *observer) excuse(id uuid.UUID) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.excused = append(o.excused, id)
}

// excusedIDs returns the excused events (never nil: a query takes it as
// an array).
func (o *observer) excusedIDs() []uuid.UUID {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]uuid.UUID{}, o.excused...)
}

func (o *observer) close() {
	o.cancel()
	<-o.done
}

func (o *observer) poll(ctx context.Context, every time.Duration) {
	defer close(o.done)
	defer func() { o.mu.Lock(); o.cond.Broadcast(); o.mu.Unlock() }()
	t := time.NewTicker(every)
	defer t.Stop()
	// The serving generation's rows (a resize adds the next generation's
	// beside them, and deletes them once it completes).
	leases := fmt.Sprintf(`SELECT bucket %% 65536, bucket_count, generation,
		CASE WHEN owner IS NOT NULL AND expires_at > clock_timestamp() THEN owner ELSE '' END,
		clock_timestamp() FROM %[1]s.lease_buckets
		WHERE subscription = $1 AND generation = coalesce(
			(SELECT generation FROM %[1]s.subscriptions WHERE subscription = $1), 0)`, o.q)
	cps := fmt.Sprintf(`SELECT bucket, position FROM %s.checkpoints WHERE subscription = $1`, o.q)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s := sample{owner: make([]string, o.n)}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		rows, err := o.pool.Query(cctx, leases, o.sub)
		if err == nil {
			for rows.Next() {
				var b, n int
				var owner string
				if err = rows.Scan(&b, &n, &s.generation, &owner, &s.at); err != nil {
					break
				}
				if n != len(s.owner) {
					s.owner = make([]string, n) // a resized subscription's count
				}
				if b >= 0 && b < n {
					s.owner[b] = owner
				}
			}
			rows.Close()
			if err == nil {
				err = rows.Err()
			}
		}
		var got map[int]int64
		if err == nil {
			got = map[int]int64{}
			rows, err = o.pool.Query(cctx, cps, o.sub)
			if err == nil {
				for rows.Next() {
					var b int
					var pos int64
					if err = rows.Scan(&b, &pos); err != nil {
						break
					}
					got[b] = pos
				}
				rows.Close()
				if err == nil {
					err = rows.Err()
				}
			}
		}
		cancel()
		o.mu.Lock()
		if err != nil || s.at.IsZero() {
			o.pollErrors++
			o.mu.Unlock()
			continue
		}
		s.checked = true
		for b, pos := range got {
			if prev, ok := o.cpSeen[b]; ok && pos < prev {
				o.regressions = append(o.regressions, fmt.Sprintf("bucket %d: %d after %d", b, pos, prev))
			}
			o.cpSeen[b] = max(o.cpSeen[b], pos)
		}
		o.last = s
		o.seq++
		o.cond.Broadcast()
		o.mu.Unlock()
	}
}

// next waits for a sample read after the call and returns it.
func (o *observer) next(ctx context.Context) (sample, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	seq := o.seq
	for o.seq == seq || o.seq == seq+1 { // seq+1 may have started before the call
		if ctx.Err() != nil {
			return sample{}, false
		}
		select {
		case <-o.done:
			return sample{}, false
		default:
		}
		waitCond(o.cond, 100*time.Millisecond)
	}
	return o.last, true
}

// waitCond waits on c (locked) for at most d.
func waitCond(c *sync.Cond, d time.Duration) {
	t := time.AfterFunc(d, func() { c.L.Lock(); c.Broadcast(); c.L.Unlock() })
	c.Wait()
	t.Stop()
}

// fair reports whether s shows every bucket held by one of live, each of
// them holding between floor(N/k) and ceil(N/k).
func fair(s sample, live []string) bool {
	if len(live) == 0 {
		return false
	}
	n := len(s.owner)
	counts := map[string]int{}
	for _, w := range live {
		counts[w] = 0
	}
	for _, w := range s.owner {
		if _, ok := counts[w]; !ok {
			return false // free, expired, or held by someone not live
		}
		counts[w]++
	}
	lo, hi := n/len(live), (n+len(live)-1)/len(live)
	for _, c := range counts {
		if c < lo || c > hi {
			return false
		}
	}
	return true
}

// waitFairSplit waits until a sample shows a fair split among live() and
// returns when it was read; false after timeout.
func (o *observer) waitFairSplit(live func() []string, timeout time.Duration) (time.Time, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		s, ok := o.next(ctx)
		if !ok {
			return time.Time{}, false
		}
		if fair(s, live()) {
			return s.at, true
		}
	}
}

// waitOwnedBy waits until no bucket is held by worker and every bucket is
// held; it returns when that was read.
func (o *observer) waitTakenFrom(worker string, timeout time.Duration) (time.Time, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		s, ok := o.next(ctx)
		if !ok {
			return time.Time{}, false
		}
		done := true
		for _, w := range s.owner {
			if w == "" || w == worker {
				done = false
				break
			}
		}
		if done {
			return s.at, true
		}
	}
}

// owned returns the buckets each worker holds in the latest sample.
func (o *observer) owned() map[string][]int {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]int{}
	for b, w := range o.last.owner {
		out[w] = append(out[w], b)
	}
	return out
}

// ownedSummary renders owned() for failure messages.
func (o *observer) ownedSummary() string {
	m := o.owned()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		name := k
		if name == "" {
			name = "(free)"
		}
		fmt.Fprintf(&b, "%s:%d ", name, len(m[k]))
	}
	return b.String()
}

// workersSummary describes the group's worker rows for a failure
// message: how many, how many live by the database's clock, and the
// oldest and newest heartbeat.
func (o *observer) workersSummary() string {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var n, live int64
	var oldest, newest *time.Time
	err := o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*), count(*) FILTER (WHERE expires_at > now()),
		min(heartbeat_at), max(heartbeat_at) FROM %s.lease_workers WHERE subscription = $1`, o.q), o.sub).
		Scan(&n, &live, &oldest, &newest)
	if err != nil {
		return "workers: " + err.Error()
	}
	var passes int64
	_ = o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s.obs_worker_log WHERE subscription = $1`, o.q), o.sub).Scan(&passes)
	return fmt.Sprintf("workers: %d rows, %d live, heartbeats %v – %v (now %v), %d worker-row changes logged",
		n, live, oldest, newest, time.Now().UTC().Format(time.StampMilli), passes)
}

// lastPass returns the start of the last pass of worker that landed
// before t (its last worker heartbeat): the worker's EnsureHeld judges
// by a renewal that started no later than that.
func (o *observer) lastPass(worker string, before time.Time) time.Time {
	o.t.Helper()
	var at *time.Time
	err := o.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT max(heartbeat_at) FROM %s.obs_worker_log
		WHERE subscription = $1 AND worker = $2 AND at < $3`, o.q), o.sub, worker, before).Scan(&at)
	if err != nil || at == nil {
		o.t.Fatalf("observer: last pass of %s: %v", worker, err)
	}
	return *at
}

// firstGrant returns when worker was next granted a bucket after t, or a
// far future time if it never was.
func (o *observer) firstGrant(worker string, after time.Time) time.Time {
	o.t.Helper()
	var at *time.Time
	err := o.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT min(tx_now) FROM %s.obs_lease_log
		WHERE subscription = $1 AND new_owner = $2 AND at > $3`, o.q), o.sub, worker, after).Scan(&at)
	if err != nil {
		o.t.Fatalf("observer: first grant of %s: %v", worker, err)
	}
	if at == nil {
		return after.Add(24 * time.Hour)
	}
	return *at
}

// deadLetters counts the subscription's dead letters.
func (o *observer) deadLetters() int64 {
	o.t.Helper()
	var n int64
	err := o.pool.QueryRow(context.Background(), fmt.Sprintf(`SELECT count(*) FROM %s.dead_letters WHERE subscription = $1`, o.q),
		o.sub).Scan(&n)
	if err != nil {
		o.t.Fatalf("observer: dead letters: %v", err)
	}
	return n
}

// waitWorking waits until every one of workers has completed a pass that
// began after t and has had a delivery recorded after t; it returns when
// the last of them did, false after timeout.
func (o *observer) waitWorking(workers []string, t time.Time, timeout time.Duration) (time.Time, bool) {
	q := fmt.Sprintf(`SELECT w,
		(SELECT min(at) FROM %[1]s.obs_worker_log m WHERE m.subscription = $1 AND m.worker = w AND m.heartbeat_at > $3),
		(SELECT min(at) FROM %[1]s.obs_delivery_log d WHERE d.subscription = $1 AND d.app = w AND d.at > $3)
		FROM unnest($2::text[]) AS w`, o.q)
	deadline := time.Now().Add(timeout)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		rows, err := o.pool.Query(ctx, q, o.sub, workers, t)
		var last time.Time
		ready := err == nil
		if err == nil {
			for rows.Next() {
				var w string
				var pass, delivery *time.Time
				if err := rows.Scan(&w, &pass, &delivery); err != nil || pass == nil || delivery == nil {
					ready = false
					continue
				}
				last = maxTime(last, maxTime(*pass, *delivery))
			}
			rows.Close()
			ready = ready && rows.Err() == nil
		}
		cancel()
		if ready {
			return last, true
		}
		if time.Now().After(deadline) {
			return time.Time{}, false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// sessionsOf describes worker's open sessions and the lease rows they
// lock, for failure messages: a frozen or cut-off worker caught inside a
// transaction keeps its row locks, and claims skip locked rows.
func (o *observer) sessionsOf(worker string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT a.pid, a.state, coalesce(now() - a.state_change, '0'::interval)::text,
		left(a.query, 80), coalesce((SELECT string_agg(l.mode, ',') FROM pg_locks l
			WHERE l.pid = a.pid AND l.relation = '%s.lease_buckets'::regclass), ''),
		coalesce(a.wait_event_type || '/' || a.wait_event, ''),
		coalesce((SELECT string_agg(b.pid || ' ' || b.application_name || ' ' || coalesce(b.state, '') || ': ' || left(b.query, 60), '; ')
			FROM pg_stat_activity b WHERE b.pid = ANY(pg_blocking_pids(a.pid))), '')
		FROM pg_stat_activity a WHERE a.application_name = $1 ORDER BY a.pid`, o.q), worker)
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	var pid int
	var state, since, query, locks, wait, blockers string
	_, err = pgx.ForEachRow(rows, []any{&pid, &state, &since, &query, &locks, &wait, &blockers}, func() error {
		fmt.Fprintf(&b, "\n  pid %d %s for %s, lease_buckets locks [%s]: %s", pid, state, since, locks, query)
		if wait != "" {
			fmt.Fprintf(&b, "\n    waiting on %s", wait)
		}
		if blockers != "" {
			fmt.Fprintf(&b, "\n    blocked by %s", blockers)
		}
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return b.String()
}
