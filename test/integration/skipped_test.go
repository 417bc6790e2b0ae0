package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestSkippedWritesAreCaught shows that skipped_writes catches a skip,
// which no scenario can be made to produce: a short run of one worker
// counts none; then, its worker stopped, an event is appended and
// sequenced, and a session named after the worker moves the event's
// slot's checkpoint over it as the worker's flush would — one skipped
// write, with its story; the event delivered afterwards (as a zombie or a
// takeover would: the skip masked, nothing lost) leaves it counted; and
// neither the worker moving over an event it dead-lettered first nor the
// operator's CLI moving a checkpoint over an unhandled event counts.
func TestSkippedWritesAreCaught(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 2, Kind: leasestore.KindRow})
	e.startWorkers(1, startOpts{})
	e.startLoad(100, 20)
	e.o.waitHandled(t, 50, time.Minute)
	r := e.finish("skip-detector")
	requireSafe(t, r)
	worker := e.c.current("w1").id

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, store := openStore(t, e)
	defer pool.Close()
	// appendOne appends an event to stream, sequences it, and returns its
	// id, its position and its slot.
	appendOne := func(stream string) (id string, pos int64, slot int) {
		t.Helper()
		if _, err := store.Append(ctx, stream, eventsource.Any, []eventsource.EventData{{Type: "Late", Data: []byte(`{}`)}}); err != nil {
			t.Fatal(err)
		}
		q := fmt.Sprintf(`SELECT e.event_id::text, e.position, %[1]s.cg_bucket(e.cg_hash, $2) FROM `+eventsWithPositions(e.o.q)+` e
			WHERE e.stream_name = $1 AND e.position IS NOT NULL ORDER BY e.version DESC LIMIT 1`, e.o.q)
		pgtest.Eventually(t, 30*time.Second, func() bool {
			_, _ = store.Sequence(ctx)
			return pool.QueryRow(ctx, q, stream, e.cfg.Buckets).Scan(&id, &pos, &slot) == nil
		}, "%s's event sequenced", stream)
		return id, pos, slot
	}
	// The worker's and the operator's stores: sessions named after them.
	workerStore, operatorStore := storeAs(t, e, worker), storeAs(t, e, "operator")
	save := func(s *eventsource.Store, slot int, pos int64) {
		t.Helper()
		if _, err := s.SaveCheckpoint(ctx, e.cfg.Subscription, slot, pos, nil); err != nil {
			t.Fatal(err)
		}
	}

	stream := categoryName + "-skipped"
	id, pos, slot := appendOne(stream)
	save(workerStore, slot, pos)
	r = e.o.collect("skip-detector-forced", e.cfg.Kind.String(), nil)
	if r.skippedWrites != 1 || r.lost != 1 {
		t.Fatalf("a checkpoint moved over an unhandled event: skipped_writes=%d lost=%d, want 1 and 1%s", r.skippedWrites, r.lost, r.skippedStory)
	}
	t.Logf("the forced skip's story:%s", r.skippedStory)
	for _, want := range []string{fmt.Sprintf("slot %d ", slot), "by " + worker, fmt.Sprintf("position %d: %s v0 (event %s): never delivered", pos, stream, id)} {
		if !strings.Contains(r.skippedStory, want) {
			t.Errorf("the skipped write's story does not say %q:%s", want, r.skippedStory)
		}
	}
	// The lost event's story names the write that crossed it, quotes its
	// writer's log and asks its writer's /status (stopped by now).
	lost := e.o.lostStory()
	for _, want := range []string{"lost event " + id, fmt.Sprintf("slot %d: ", slot), fmt.Sprintf(" → %d by %s", pos, worker), worker + "'s log about slot",
		fmt.Sprintf("%s's /status of slot %d: no running process", worker, slot)} {
		if !strings.Contains(lost, want) {
			t.Errorf("the lost event's story does not say %q:%s", want, lost)
		}
	}

	// Delivered late, as a zombie's or a new owner's would be.
	if _, err := workerStore.Pool().Exec(ctx, fmt.Sprintf(`INSERT INTO %s.sink (subscription, event_id, position, stream, version, worker)
		VALUES ($1, $2::uuid, $3, $4, 0, $5)`, e.o.q), e.cfg.Subscription, id, pos, stream, worker); err != nil {
		t.Fatal(err)
	}
	r = e.o.collect("skip-detector-masked", e.cfg.Kind.String(), nil)
	if r.skippedWrites != 1 || r.lost != 0 {
		t.Errorf("the skip masked by a late delivery: skipped_writes=%d lost=%d, want 1 and 0%s", r.skippedWrites, r.lost, r.skippedStory)
	}
	if want := "first delivered"; !strings.Contains(r.skippedStory, want) {
		t.Errorf("the masked skip's story does not say %q:%s", want, r.skippedStory)
	}

	// Not skips: the worker moving over an event it dead-lettered first,
	// and the operator moving over an unhandled one on purpose.
	id, pos, slot = appendOne(stream)
	if _, err := workerStore.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: e.cfg.Subscription, Bucket: slot,
		EventID: uuid.MustParse(id), Reason: "forced", Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	save(workerStore, slot, pos)
	_, pos, slot = appendOne(stream)
	save(operatorStore, slot, pos)
	r = e.o.collect("skip-detector-excused", e.cfg.Kind.String(), nil)
	if r.skippedWrites != 1 {
		t.Errorf("a dead-lettered event and the operator's write: skipped_writes=%d, want 1 (the forced one)%s", r.skippedWrites, r.skippedStory)
	}
}

// storeAs returns a store on a pool whose sessions are named app
// (application_name: what the observer's logs record as the writer),
// closed when the test ends.
func storeAs(t *testing.T, e *env, app string) *eventsource.Store {
	t.Helper()
	p, err := pgxpool.New(context.Background(), withAppName(e.url, app))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	s, err := eventsource.New(p, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// skippedWrite is a checkpoint write that moved a slot's checkpoint over
// events of the slot not handled at that moment: crossed, in position
// order.
type skippedWrite struct {
	id      int64 // its obs_checkpoint_log row
	crossed []crossedEvent
}

// crossedEvent is an event a checkpoint write moved over before anyone
// had delivered or dead-lettered it.
type crossedEvent struct {
	id       string
	position int64
	stream   string
	version  int64
}

// skippedWrites finds the checkpoint writes of the subscription that moved
// a slot's checkpoint over an event of the slot that, at the write's
// moment (its clock_timestamp), no worker had delivered (no sink write
// logged before it, first or not) and none had dead-lettered: a skip, the
// cause of a loss — or of a near miss when someone (a zombie, a takeover
// from an older checkpoint) delivers it later, which the lost count never
// sees. A write moves slot s (generation s / 65536, bucket s % 65536 of
// that generation's N) from old to new; the events it crosses are those of
// the category whose cg_bucket(hash, N) is the bucket, with a position in
// (old, new] and within the generation's positions (start_after, end_at].
// A write that creates the checkpoint (an INSERT) moves it from the
// generation's start: 0, or the cut C for a resize's new generation.
//
// Not counted: excused events (observer.excuse), and writes by the
// operator's CLI (application_name "operator", see env.resize), which may
// move a checkpoint anywhere on purpose (kumi checkpoints reset). None of
// the following is a crossing, by the timestamps alone:
//
//   - an exactly-once commit (actors.CommitWithCheckpoint): the sink
//     insert and the checkpoint share a transaction, and the insert's
//     statement, so its clock_timestamp, comes first;
//   - an at-least-once flush: the handler's upsert committed before it
//     answered, before its event was acked, before the flush;
//   - a resize's decision: it inserts every new slot's checkpoint at the
//     cut C, the generation's start (nothing to cross);
//   - a drain: it writes C on an old slot once every event of the slot up
//     to C was acked or dead-lettered (actors/resize_reader.go);
//   - a reader resuming after what its predecessor at its epoch handled
//     (actors reader.resumeAt): those events were acked or dead-lettered
//     before;
//   - a dead letter written again later (its created_at moves on): the
//     observer's obs_dead_letter_log keeps its first writing.
//
// clock_timestamp() is taken at the statement, not at commit; both the
// delivery and the write are logged by triggers inside their statements,
// so "delivered before" compares statement times, and a delivery
// committed before the write was necessarily logged before it. Equal
// timestamps count as before (two statements in one microsecond).
//
// Per write, only the slot's events in its range are read: the append
// ranges of the bucket through the consumer-group index (its expression
// with the literal N the index was built with, one arm per bucket count;
// row comparisons, as the store's bucket read, so that no other index can
// serve it), bounded by the longest range of the category, then the
// ranges' events by the events' primary key. On TestResizeUp's short form
// (13,000 events, 500 writes) it takes about 0.2 s.
func (o *observer) skippedWrites(ctx context.Context) ([]skippedWrite, error) {
	rows, err := o.pool.Query(ctx, fmt.Sprintf(`SELECT bucket_count FROM %s.generations WHERE subscription = $1
		UNION SELECT $2::int`, o.q), o.sub, o.n)
	if err != nil {
		return nil, err
	}
	counts, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return nil, err
	}
	// Each arm goes through two Sprintfs: %%%% becomes %.
	arms := make([]string, 0, len(counts))
	for _, n := range counts {
		arms = append(arms, fmt.Sprintf(`SELECT w.id, w.lo, w.hi, w.at, a.stream_name, a.first_version, a.last_version, a.last_position
			FROM w JOIN LATERAL (
				SELECT a.stream_name, a.first_version, a.last_version, a.last_position FROM %[1]s.appends a
				WHERE a.category = $2 AND a.last_position IS NOT NULL
					AND ((((a.cg_hash %%%% %[2]d) + %[2]d) %%%% %[2]d), a.last_position) > (w.slot %%%% 65536, w.lo)
					AND ((((a.cg_hash %%%% %[2]d) + %[2]d) %%%% %[2]d), a.last_position) <= (w.slot %%%% 65536, w.top)
					AND a.last_position - a.last_version + a.first_version <= w.hi) a ON true
			WHERE w.n = %[2]d`, o.q, n))
	}
	// A write's events lie in ranges whose last position is in (lo, top]:
	// top is hi plus the longest range's length less one.
	var span int64
	if err := o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(max(last_version - first_version), 0) FROM %s.appends
		WHERE category = $1 AND last_position IS NOT NULL`, o.q), o.cat).Scan(&span); err != nil {
		return nil, err
	}
	rows, err = o.pool.Query(ctx, fmt.Sprintf(`WITH b AS (
			SELECT c.id, c.bucket AS slot, coalesce(g.bucket_count, $3) AS n, c.at,
				greatest(coalesce(c.old_position, 0), coalesce(g.start_after, 0)) AS lo,
				least(c.new_position, coalesce(g.end_at, c.new_position)) AS hi
			FROM %[1]s.obs_checkpoint_log c
			LEFT JOIN %[1]s.generations g ON g.subscription = c.subscription AND g.generation = c.bucket / 65536
			WHERE c.subscription = $1 AND c.app IS DISTINCT FROM 'operator' AND c.new_position > coalesce(c.old_position, 0)
		), w AS MATERIALIZED (SELECT b.*, b.hi + $5 AS top FROM b WHERE b.hi > b.lo), r AS (`+strings.Join(arms, "\nUNION ALL\n")+`)
		SELECT r.id, e.event_id::text, r.last_position - r.last_version + e.version, e.stream_name, e.version
		FROM r JOIN %[1]s.events e ON e.stream_name = r.stream_name
			AND e.version BETWEEN greatest(r.first_version, r.lo - r.last_position + r.last_version + 1)
				AND least(r.last_version, r.hi - r.last_position + r.last_version)
		WHERE e.event_id <> ALL($4::uuid[])
			AND NOT EXISTS (SELECT 1 FROM %[1]s.obs_delivery_log d
				WHERE d.subscription = $1 AND d.event_id = e.event_id AND d.at <= r.at)
			AND NOT EXISTS (SELECT 1 FROM %[1]s.obs_dead_letter_log l
				WHERE l.subscription = $1 AND l.event_id = e.event_id AND l.at <= r.at)
		ORDER BY 1, 3`, o.q), o.sub, o.cat, o.n, o.excusedIDs(), span)
	if err != nil {
		return nil, err
	}
	var out []skippedWrite
	var id int64
	var e crossedEvent
	_, err = pgx.ForEachRow(rows, []any{&id, &e.id, &e.position, &e.stream, &e.version}, func() error {
		if len(out) == 0 || out[len(out)-1].id != id {
			out = append(out, skippedWrite{id: id})
		}
		w := &out[len(out)-1]
		w.crossed = append(w.crossed, e)
		return nil
	})
	return out, err
}

// skippedStory tells, for a failure message, the first few skipped writes:
// the write (slot, old → new, writer, time, commit time), each event it
// crossed and when and by whom it was first delivered or dead-lettered,
// if ever; the slot's lease changes and checkpoint writes around it; and
// the writer's log about the slot around it.
func (o *observer) skippedStory(ctx context.Context, skipped []skippedWrite) string {
	var b strings.Builder
	const writes, events = 4, 5
	for _, w := range skipped[:min(len(skipped), writes)] {
		var slot int
		var old *int64
		var pos int64
		var at time.Time
		var app string
		var committed *time.Time
		err := o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT bucket, old_position, new_position, at, coalesce(app, ''),
			CASE WHEN current_setting('track_commit_timestamp') = 'on' THEN pg_xact_commit_timestamp(xmin) END
			FROM %s.obs_checkpoint_log WHERE id = $1`, o.q), w.id).Scan(&slot, &old, &pos, &at, &app, &committed)
		if err != nil {
			fmt.Fprintf(&b, "\n(checkpoint write %d: %v)", w.id, err)
			continue
		}
		from := "(none: created)"
		if old != nil {
			from = fmt.Sprint(*old)
		}
		commit := "-"
		if committed != nil {
			commit = committed.Format(time.StampMicro)
		}
		fmt.Fprintf(&b, "\n--- slot %d (generation %d, bucket %d): checkpoint %s → %d by %s at %s (committed %s), over %d unhandled event(s)",
			slot, slot/65536, slot%65536, from, pos, app, at.Format(time.StampMicro), commit, len(w.crossed))
		for _, e := range w.crossed[:min(len(w.crossed), events)] {
			var first, dead *time.Time
			var by string
			err := o.pool.QueryRow(ctx, fmt.Sprintf(`SELECT
					(SELECT d.at FROM %[1]s.obs_delivery_log d WHERE d.subscription = $1 AND d.event_id = $2::uuid ORDER BY d.at LIMIT 1),
					coalesce((SELECT d.app FROM %[1]s.obs_delivery_log d WHERE d.subscription = $1 AND d.event_id = $2::uuid ORDER BY d.at LIMIT 1), ''),
					(SELECT min(l.at) FROM %[1]s.obs_dead_letter_log l WHERE l.subscription = $1 AND l.event_id = $2::uuid)`, o.q),
				o.sub, e.id).Scan(&first, &by, &dead)
			var fate string
			switch {
			case err != nil:
				fate = err.Error()
			case first != nil:
				fate = fmt.Sprintf("first delivered %s after the write, at %s by %s", round(first.Sub(at)), first.Format(time.StampMicro), by)
			case dead == nil:
				fate = "never delivered"
			}
			if dead != nil {
				fate = strings.TrimPrefix(fate+fmt.Sprintf(", dead-lettered %s after the write", round(dead.Sub(at))), ", ")
			}
			fmt.Fprintf(&b, "\n  position %d: %s v%d (event %s): %s", e.position, e.stream, e.version, e.id, fate)
		}
		if len(w.crossed) > events {
			fmt.Fprintf(&b, "\n  … and %d more", len(w.crossed)-events)
		}
		around := []any{o.sub, slot, at.Add(-5 * time.Second), at.Add(time.Second)}
		leases, err := o.texts(ctx, slotLeaseChanges, around...)
		if err == nil {
			var cps []string
			cps, err = o.texts(ctx, slotCheckpointWrites, around...)
			fmt.Fprintf(&b, "\nthe slot's lease changes from 5 s before to 1 s after:\n  %s\nits checkpoint writes then:\n  %s",
				strings.Join(leases, "\n  "), strings.Join(cps, "\n  "))
		}
		if err != nil {
			fmt.Fprintf(&b, "\n(the slot's history: %v)", err)
		}
		b.WriteString(o.workerLog(app, "from 3 s before the write to 1 s after", at.Add(-3*time.Second), at.Add(time.Second), slot))
	}
	if len(skipped) > writes {
		fmt.Fprintf(&b, "\n… and %d more skipped writes", len(skipped)-writes)
	}
	return b.String()
}

// slotLeaseChanges and slotCheckpointWrites are queries for observer.texts:
// the lease changes and the checkpoint writes of subscription $1's slot $2
// between $3 and $4, one line each.
const (
	slotLeaseChanges = `SELECT format('%%s %%s@%%s → %%s@%%s expired %%s evidence %%s by %%s', l.at,
			coalesce(l.old_owner, '(none)'), l.old_epoch, coalesce(l.new_owner, '(none)'), l.new_epoch,
			coalesce(l.old_expires::text, '-'), l.evidence, l.app)
		FROM %[1]s.obs_lease_log l WHERE l.subscription = $1 AND l.bucket = $2 AND l.at BETWEEN $3 AND $4 ORDER BY l.at`
	slotCheckpointWrites = `SELECT format('%%s %%s → %%s by %%s', c.at, coalesce(c.old_position::text, '(created)'), c.new_position, c.app)
		FROM %[1]s.obs_checkpoint_log c WHERE c.subscription = $1 AND c.bucket = $2 AND c.at BETWEEN $3 AND $4 ORDER BY c.at`
)

// texts runs query, with the schema for %[1]s, and returns its rows'
// single text column.
func (o *observer) texts(ctx context.Context, query string, args ...any) ([]string, error) {
	rows, err := o.pool.Query(ctx, fmt.Sprintf(query, o.q), args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// workerLog returns, for a failure message, what worker app logged
// between from and to (span says when that is) about slot, and its
// warnings and errors; "" when its log is unknown (not a worker of the
// scenario).
func (o *observer) workerLog(app, span string, from, to time.Time, slot int) string {
	if o.logOf == nil {
		return ""
	}
	path := o.logOf(app)
	if path == "" {
		return ""
	}
	lines := logAround(path, from, to, 40, fmt.Sprintf("slot=%d ", slot), fmt.Sprintf("bucket=%d ", slot))
	if lines == "" {
		lines = "(none about the slot, no warning, no error)"
	}
	return fmt.Sprintf("\n%s's log %s:\n%s", app, span, lines)
}
