package eventsource

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// queries holds the store's SQL, built once for its schema. Every statement
// of the package is here, in one place to read and review: those built once
// per store in queries, and below them those that depend on a group size or
// a name.
type queries struct {
	// append holds the append statements by expected-version mode (see
	// appendMode) for a batch [0] and for a single event [1].
	append        [4][2]string
	streamVersion string

	readStreamForward, readStreamBackward readSQL
	readCategory, readAll                 readSQL
	readEventsByID                        readSQL
	headPosition                          string
	categories                            string
	serverLook                            string

	sequencerLastSeq, sequencerLock, sequencerAssign, sequencerPending string
	sequencerBacklog, sequencerTimeout, sequencerLowerWatermark        string
	sequencerHolder, sequencerStranded                                 string

	checkpointGet, checkpointList, checkpointSave, checkpointReset string

	deadLetterAdd, deadLetterList, deadLetterGet       string
	deadLetterMark, deadLetterFailed, deadLetterDelete string

	// Parked streams (migration 0007; parked.go).
	parkAdd, parkList, parkRequest, parkDiscardLetter, parkRelease, parkState, parkHeldBy string

	indexState string

	checkpointLock, operatorNow, subscriptionList, subscriptionKnown, categoryCount string

	// The failover record (migration 0006; Store.recordServerChanges).
	serverChangeNote, serverChangeList string
}

// readSQL is a read of events in two forms: in full, and keys only, the
// same rows without their payloads (see Store.query).
type readSQL struct{ full, keys string }

// eventRead builds both forms of a read from what follows its column list:
// the events are e, and pos is the SQL of an event's position.
func eventRead(pos, format string, args ...any) readSQL {
	from := fmt.Sprintf(format, args...)
	cols := func(payload string) string {
		return "SELECT e.event_id, e.stream_name, e.category, e.version, " + pos + ", e.cg_hash, e.type, " + payload + ", e.recorded_at "
	}
	return readSQL{full: cols("e.data, e.metadata") + from, keys: cols("NULL::jsonb, NULL::jsonb") + from}
}

// Positions are kept per append, in the appends table (migration 0004,
// docs/design/eventsource.md "Sequencing appends"): a range of consecutive
// versions of one stream whose last event has last_position.
const (
	// rangePosition is the position of event e in its range a.
	rangePosition = `a.last_position - a.last_version + e.version`
	// streamPosition is the position of event e, 0 while unsequenced,
	// from the lateral join rangeOf.
	streamPosition = `coalesce(r.position, 0)`
	// rangeEvents joins the events of range a above the position $%d
	// (the read's cursor), in version order by the primary key.
	rangeEvents = `JOIN %[1]s.events e ON e.stream_name = a.stream_name
  AND e.version BETWEEN GREATEST(a.first_version, a.last_version - a.last_position + $%[2]d + 1) AND a.last_version`
	// rangeOf finds the range of event e (the one with the largest first
	// version at or below e's version) and its position, NULL while
	// unsequenced: one probe of the appends' primary key.
	rangeOf = `LEFT JOIN LATERAL (SELECT ra.last_position - ra.last_version + e.version AS position FROM %[1]s.appends ra
  WHERE ra.stream_name = e.stream_name AND ra.first_version <= e.version AND ra.last_version >= e.version
  ORDER BY ra.first_version DESC LIMIT 1) r ON true`
	// parkedColumns are a parked_streams row p's, with the events
	// waiting behind it (from the stream's row: cheap).
	parkedColumns = `p.subscription, p.stream_name, p.cg_hash, p.event_id, p.position, p.version,
  p.done_version, p.reason, p.parked_at, coalesce(p.action, ''), p.requested_at,
  GREATEST(coalesce((SELECT s.version FROM %[1]s.streams s WHERE s.stream_name = p.stream_name), p.done_version) - p.done_version, 0)`
	deadLetterColumns = `subscription, generation, bucket, event_id, position, stream_name, reason, attempts, created_at, replayed_at, history`
)

// rangeRead is a global read: the ranges of where (on appends a, in
// order, with the position $cursor the cursor) joined to their events
// above the cursor. Rows come out in the order of (order, e.version),
// which is position order since ranges do not overlap: an incremental sort
// of each range's events over the ordered index scan of the ranges.
func rangeRead(q, where, order string, cursor int, limit int) readSQL {
	return eventRead(rangePosition, `FROM %[1]s.appends a `+rangeEvents+`
WHERE %[3]s ORDER BY %[4]s, e.version LIMIT $%[5]d`, q, cursor, where, order, limit)
}

func newQueries(q string) queries {
	// $1 stream, $2 count, $3 ids, $4 types, $5 data, $6 metadata,
	// $7 category, $8 cardinal id, $9 hash, $10 the expected version; the
	// CTE s returns the stream's new version, or no row when the expected
	// version does not hold, in which case nothing is inserted. The
	// single-event form takes scalars for $3 to $6: cheaper to encode and
	// to plan than one-element arrays.
	// The statement returns one row, the stream's new version and the
	// count of events inserted, or none. (The single-event form returns
	// the inserted row's version: a little cheaper than counting.)
	// The CTE r inserts the append's range (see migration 0004): it
	// draws the append's seq after s holds the stream's row, and the
	// events carry it.
	ranges := func(streamCTE string) string {
		return fmt.Sprintf(`WITH s AS (%s), r AS (
INSERT INTO %[2]s.appends (stream_name, first_version, last_version, category, cg_hash)
SELECT $1, s.version - $2 + 1, s.version, $7, $9 FROM s RETURNING seq)`, streamCTE, q)
	}
	batch := func(streamCTE string) string {
		return fmt.Sprintf(`%s, ins AS (
INSERT INTO %[2]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data, metadata)
SELECT r.seq, u.id, $1, $7, $8, $9, s.version - $2 + u.ord, u.type, u.data::jsonb, u.meta::jsonb
FROM s, r, unnest($3::uuid[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS u(id, type, data, meta, ord)
RETURNING 1)
SELECT s.version, (SELECT count(*) FROM ins) FROM s`, ranges(streamCTE), q)
	}
	single := func(streamCTE string) string {
		return fmt.Sprintf(`%s
INSERT INTO %[2]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data, metadata)
SELECT r.seq, $3::uuid, $1, $7, $8, $9, s.version, $4::text, $5::text::jsonb, $6::text::jsonb FROM s, r
RETURNING version, 1::bigint`, ranges(streamCTE), q)
	}
	both := func(streamCTE string) [2]string { return [2]string{batch(streamCTE), single(streamCTE)} }
	return queries{
		append: [4][2]string{
			modeAny: both(fmt.Sprintf(`INSERT INTO %s.streams AS st (stream_name, version) VALUES ($1, $2::bigint - 1)
ON CONFLICT (stream_name) DO UPDATE SET version = st.version + $2 RETURNING version`, q)),
			modeNoStream: both(fmt.Sprintf(`INSERT INTO %s.streams (stream_name, version) VALUES ($1, $2::bigint - 1)
ON CONFLICT (stream_name) DO NOTHING RETURNING version`, q)),
			modeExists: both(fmt.Sprintf(`UPDATE %s.streams SET version = version + $2 WHERE stream_name = $1 RETURNING version`, q)),
			modeExact: both(fmt.Sprintf(`UPDATE %s.streams SET version = version + $2 WHERE stream_name = $1 AND version = $10
RETURNING version`, q)),
		},
		streamVersion: fmt.Sprintf(`SELECT version FROM %s.streams WHERE stream_name = $1`, q),

		readStreamForward: eventRead(streamPosition, `FROM %[1]s.events e `+rangeOf+`
WHERE e.stream_name = $1 AND e.version >= $2 ORDER BY e.version LIMIT $3`, q),
		readStreamBackward: eventRead(streamPosition, `FROM %[1]s.events e `+rangeOf+`
WHERE e.stream_name = $1 AND e.version <= $2 ORDER BY e.version DESC LIMIT $3`, q),
		readCategory: rangeRead(q, `a.category = $1 AND a.last_position > $2`, `a.last_position`, 2, 3),
		readAll:      rangeRead(q, `a.last_position > $1`, `a.last_position`, 1, 2),
		// The events of $1, in its order.
		readEventsByID: eventRead(streamPosition, `FROM unnest($1::uuid[]) WITH ORDINALITY AS k(id, ord)
JOIN %[1]s.events e ON e.event_id = k.id `+rangeOf+` ORDER BY k.ord`, q),
		headPosition: fmt.Sprintf(`SELECT last_position FROM %s.sequencer WHERE id = 1`, q),
		// A skip scan of the appends' (category, position) index: one
		// probe per category.
		categories: fmt.Sprintf(`WITH RECURSIVE c(category) AS (
  (SELECT category FROM %[1]s.appends WHERE last_position IS NOT NULL ORDER BY category LIMIT 1)
  UNION ALL
  SELECT (SELECT a.category FROM %[1]s.appends a
           WHERE a.last_position IS NOT NULL AND a.category > c.category ORDER BY a.category LIMIT 1)
    FROM c WHERE c.category IS NOT NULL
) SELECT category FROM c WHERE category IS NOT NULL LIMIT $1`, q),
		// Store.lookAtServer: the timeline (the name of the WAL file being
		// written starts with it; fails on a standby) and the head.
		serverLook: fmt.Sprintf(`SELECT pg_walfile_name(pg_current_wal_lsn()),
  coalesce((SELECT last_position FROM %s.sequencer WHERE id = 1), 0)`, q),
		serverChangeNote: fmt.Sprintf(`SELECT %s.note_server_change($1, $2, $3, $4, $5, $6, $7)`, q),
		serverChangeList: fmt.Sprintf(`SELECT id, found_at, reason, old_system, old_timeline, new_system, new_timeline,
  head_before, coalesce(head_after, -1), found_by, reports FROM %s.server_changes ORDER BY id DESC LIMIT $1`, q),

		// The head, the age of the oldest unsequenced event above the
		// watermark in insertion order (NULL when there is none), the
		// watermark and the sequence's last value ($1 is the quoted appends
		// table): the sequencer's cheap look when idle, which also notices
		// a reset of the sequence (see Store.sequenceOnce).
		sequencerPending: fmt.Sprintf(`SELECT s.last_position, (SELECT extract(epoch FROM now() - a.recorded_at)::float8
  FROM %[1]s.appends a WHERE a.last_position IS NULL AND a.seq > s.low_seq ORDER BY a.seq LIMIT 1),
  s.low_seq, coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')::regclass), 0)
FROM %[1]s.sequencer s WHERE s.id = 1`, q),
		// A stuck sequencer's report counts the committed events that wait
		// above the watermark, at most $1 of them, in a transaction whose
		// statement timeout the first statement sets to its $1.
		sequencerTimeout: `SELECT set_config('statement_timeout', $1, true)`,
		sequencerBacklog: fmt.Sprintf(`SELECT LEAST(coalesce(sum(b.n), 0), $1::bigint)::bigint FROM (SELECT last_version - first_version + 1 AS n
FROM %[1]s.appends WHERE last_position IS NULL AND seq > (SELECT low_seq FROM %[1]s.sequencer WHERE id = 1) LIMIT $1::bigint) b`, q),
		// The transaction's own settings first, then the sequence's last
		// value; $1 is the quoted appends table. This statement runs under
		// the session's timeouts (a role's or a database's), every later
		// one under the sequencer's: $2 and $3 are its statement and lock
		// timeouts, and a transaction_timeout (PostgreSQL 17 and later) is
		// lifted, so that whatever a DBA sets, a step that the sequencer's
		// own bounds allow can finish. The idle timeout, $4, frees the row
		// should this process stall (paused, partitioned) between the
		// sequencer's statements: no one else could sequence until then
		// (see sequencerStallTimeout).
		// With synchronous_commit off, the sequencer's commit is made
		// durable anyway (flushing, with it, every append before it in the
		// WAL): positions that readers have seen must survive a crash, or
		// they would be handed out again to other events, behind the
		// readers' checkpoints. It is made "on", not "local": with
		// synchronous_standby_names set, "on" also waits for the
		// synchronous standby to flush it, so that the positions survive
		// a failover to that standby too (docs/operations.md, "Failover");
		// a session that asks for more (remote_apply) keeps it. The planner settings pin the assignment's
		// plan to what suits a batch among millions of rows, whatever the
		// statistics say (a plan cached while the table was small would
		// otherwise read a whole backlog and sort it for every batch): an
		// ordered scan of the unsequenced index that stops after the
		// batch, and a nested loop of TID lookups. A disabled plan node
		// puts the plan's cost far above the JIT threshold, and compiling
		// it took half a second: no JIT. The last value is read
		// before the lock statement, which assigns the transaction's xid,
		// and after the watermark as this statement's snapshot shows it
		// (see Store.sequenceOnce).
		sequencerLastSeq: `SELECT set_config('statement_timeout', $2, true), set_config('lock_timeout', $3, true),
  CASE WHEN current_setting('transaction_timeout', true) IS NOT NULL THEN set_config('transaction_timeout', '0', true) END,
  set_config('idle_in_transaction_session_timeout', $4, true),
  CASE WHEN current_setting('synchronous_commit') = 'off' THEN set_config('synchronous_commit', 'on', true) END,
  set_config('enable_hashjoin', 'off', true), set_config('enable_mergejoin', 'off', true),
  set_config('enable_bitmapscan', 'off', true), set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true),
  set_config('jit', 'off', true),
  (SELECT low_seq FROM ` + q + `.sequencer WHERE id = 1),
  coalesce(pg_sequence_last_value(pg_get_serial_sequence($1, 'seq')::regclass), 0)`,
		// The lock statement takes the transaction's xid and reads the
		// server's timeline (see Store.sequenceOnce and ServerIdentity).
		sequencerLock: fmt.Sprintf(`SELECT last_position, low_seq, pg_current_xact_id()::text::bigint,
  pg_walfile_name(pg_current_wal_lsn())
FROM %s.sequencer WHERE id = 1 FOR UPDATE SKIP LOCKED`, q),
		// The session whose transaction holds the sequencer row (its
		// locker, xmax, holds a lock on its own transaction id; a
		// subtransaction's too), with what pg_stat_activity shows of it
		// (NULLs without the privilege to see it), and ended when that
		// shows it stalled for $1: idle in its transaction, or blocked
		// sending to its client in a statement begun that long ago. No
		// row when the row is free. See Sequencer.takeOver.
		sequencerHolder: fmt.Sprintf(`SELECT a.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  coalesce(a.state, ''), coalesce(a.wait_event, ''), coalesce(extract(epoch FROM now() - a.state_change)::float8, 0),
  CASE WHEN a.state_change <= now() - $1::interval
    AND (a.state IN ('idle in transaction', 'idle in transaction (aborted)') OR (a.state = 'active' AND a.wait_event = 'ClientWrite'))
    THEN pg_terminate_backend(a.pid) ELSE false END
FROM %s.sequencer s
JOIN pg_catalog.pg_locks l ON l.locktype = 'transactionid' AND l.transactionid = s.xmax AND l.granted AND l.mode = 'ExclusiveLock'
JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
WHERE s.id = 1 AND l.pid <> pg_backend_pid()
LIMIT 1`, q),
		// The sequencer's look below the watermark (Sequencer.rescue): the
		// first committed append at or below it without a position, which
		// by the watermark's rule cannot exist (an old primary's candidate
		// kept across a failover made such appends), its age, and whether
		// the watermark was lowered below it, so that the next step
		// numbers it. Lowering the watermark never skips an event. It
		// scans the unsequenced index up to the watermark, dead entries
		// included: hence only every sequencerReportInterval.
		sequencerStranded: fmt.Sprintf(`WITH found AS (
  SELECT a.seq, a.recorded_at FROM %[1]s.appends a
  WHERE a.last_position IS NULL AND a.seq <= (SELECT low_seq FROM %[1]s.sequencer WHERE id = 1)
  ORDER BY a.seq LIMIT 1
), lowered AS (
  UPDATE %[1]s.sequencer s SET low_seq = f.seq - 1 FROM found f WHERE s.id = 1 AND s.low_seq >= f.seq RETURNING 1
)
SELECT f.seq, extract(epoch FROM now() - f.recorded_at)::float8, EXISTS (SELECT FROM lowered) FROM found f`, q),
		// After a reset of the events' sequence (see Store.sequenceOnce):
		// the watermark goes down to $1.
		sequencerLowerWatermark: fmt.Sprintf(`UPDATE %s.sequencer SET low_seq = $1 WHERE id = 1`, q),
		// The step: at most $2 unsequenced ranges above the watermark $4,
		// in seq order, each numbered to end at the head $1 plus the sizes
		// of the ranges up to it (a running sum: dense); the new head and
		// watermark saved, the head notified on $3. $5 and $6 are the
		// watermark candidate (see Store.sequenceOnce). Returns the events
		// and the ranges numbered, the head, the watermark, the snapshot's
		// xmin, and whether the sequencer row was saved and notified. A
		// step that saved nothing commits without waiting for a flush:
		// the COMMIT follows in the same round trip, whatever this
		// returns, and it handed out no position to make durable.
		sequencerAssign: fmt.Sprintf(`WITH pending AS (
  SELECT ctid, seq, $1::bigint + sum(n) OVER (ORDER BY seq ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS pos
  FROM (SELECT ctid, seq, last_version - first_version + 1 AS n
    FROM %[1]s.appends WHERE last_position IS NULL AND seq > $4 ORDER BY seq LIMIT $2) p
), upd AS (
  UPDATE %[1]s.appends a SET last_position = pending.pos FROM pending WHERE a.ctid = pending.ctid
  RETURNING a.last_position, a.last_version - a.first_version + 1 AS n
), head AS (
  SELECT (SELECT coalesce(sum(n), 0) FROM upd)::bigint AS n, (SELECT count(*) FROM upd) AS ranges,
    (SELECT coalesce(max(last_position), $1::bigint) FROM upd) AS last,
    (SELECT max(seq) FROM pending) AS max_seq,
    pg_snapshot_xmin(pg_current_snapshot())::text::bigint AS xmin
), low AS (
  SELECT CASE WHEN $6::bigint > 0 AND h.xmin >= $6::bigint
    THEN GREATEST($4::bigint, CASE WHEN h.ranges < $2::bigint THEN $5::bigint ELSE LEAST($5::bigint, h.max_seq) END)
    ELSE $4::bigint END AS low
  FROM head h
), save AS (
  UPDATE %[1]s.sequencer SET last_position = h.last, low_seq = l.low FROM head h, low l
  WHERE id = 1 AND (h.ranges > 0 OR l.low <> $4::bigint) RETURNING 1
)
SELECT h.n, h.ranges, h.last, l.low, h.xmin, (SELECT count(*) FROM save),
  (SELECT count(*) FROM (SELECT pg_notify($3, hh.last::text) FROM head hh WHERE hh.ranges > 0) notified),
  CASE WHEN NOT EXISTS (SELECT FROM save) THEN set_config('synchronous_commit', 'off', true) END
FROM head h, low l`, q),

		checkpointGet:  fmt.Sprintf(`SELECT position FROM %s.checkpoints WHERE subscription = $1 AND bucket = $2`, q),
		checkpointList: fmt.Sprintf(`SELECT bucket, position, updated_at FROM %s.checkpoints WHERE subscription = $1 ORDER BY bucket`, q),
		// A checkpoint write lands only at or below the head (the
		// sequencer row's last position, as the statement's snapshot
		// shows it): a position above it was never handed out on this
		// server (one from before a failover, say), and a checkpoint there
		// would skip the events that get it. The head only grows on one
		// server, so what holds at the snapshot holds at commit; the
		// sequencer row is read, not locked. It returns the stored
		// position (NULL when refused) and the head.
		checkpointSave: fmt.Sprintf(`WITH h AS (SELECT last_position AS head FROM %[1]s.sequencer WHERE id = 1), w AS (
INSERT INTO %[1]s.checkpoints AS c (subscription, bucket, position) SELECT $1, $2, $3 FROM h WHERE $3 <= h.head
ON CONFLICT (subscription, bucket) DO UPDATE SET position = GREATEST(c.position, excluded.position), updated_at = now()
RETURNING position)
SELECT (SELECT position FROM w), coalesce((SELECT head FROM h), 0)`, q),
		// An operator's reset is not bounded by the head: `kumi
		// checkpoints reset` refuses a position past it unless
		// --beyond-head asks for it.
		checkpointReset: fmt.Sprintf(`INSERT INTO %[1]s.checkpoints AS c (subscription, bucket, position) VALUES ($1, $2, $3)
ON CONFLICT (subscription, bucket) DO UPDATE SET position = excluded.position, updated_at = now()`, q),

		// A dead letter names an event of the store; its position and
		// stream are taken from the event, and checked against the
		// caller's when given ($4 = 0 and $5 = '' mean "not given"); $8 is
		// the generation of the bucket $2.
		deadLetterAdd: fmt.Sprintf(`INSERT INTO %[1]s.dead_letters AS d (subscription, generation, bucket, event_id, position, stream_name, reason, attempts)
SELECT $1, $8, $2, e.event_id, r.position, e.stream_name, $6, $7 FROM %[1]s.events e `+rangeOf+`
WHERE e.event_id = $3 AND r.position IS NOT NULL AND ($4::bigint = 0 OR r.position = $4) AND ($5::text = '' OR e.stream_name = $5)
ON CONFLICT (subscription, event_id) DO UPDATE SET generation = excluded.generation, bucket = excluded.bucket, reason = excluded.reason,
  attempts = excluded.attempts, created_at = now(), replayed_at = NULL,
  history = (SELECT CASE WHEN jsonb_array_length(h) <= 20 THEN h ELSE (h -> 0) || (SELECT jsonb_agg(x ORDER BY i) FROM jsonb_array_elements(h) WITH ORDINALITY AS t(x, i) WHERE i > jsonb_array_length(h) - 19) END FROM (SELECT d.history || jsonb_build_array(jsonb_build_object('reason', d.reason, 'attempts', d.attempts, 'replaced_at', now())) AS h) AS p)
RETURNING position, stream_name, created_at`, q),
		deadLetterList: fmt.Sprintf(`SELECT %s FROM %s.dead_letters
WHERE subscription = $1 AND ($6::int IS NULL OR generation = $6) AND ($2::int IS NULL OR bucket = $2) AND position > $3
  AND ($5 OR replayed_at IS NULL)
ORDER BY position, event_id LIMIT $4`, deadLetterColumns, q),
		deadLetterGet: fmt.Sprintf(`SELECT %s FROM %s.dead_letters WHERE subscription = $1 AND event_id = $2`, deadLetterColumns, q),
		// A replay records its outcome only on the letter it replayed: $3
		// is the letter's created_at, which a new dead-lettering of the
		// event (while the handler ran) moves on.
		deadLetterMark: fmt.Sprintf(`UPDATE %s.dead_letters SET replayed_at = now()
WHERE subscription = $1 AND event_id = $2 AND created_at = $3`, q),
		// A failed replay keeps the reason it replaces in the history
		// (the first and the latest 19 entries).
		deadLetterFailed: fmt.Sprintf(`UPDATE %s.dead_letters AS d SET attempts = attempts + 1, reason = $4,
  history = (SELECT CASE WHEN jsonb_array_length(h) <= 20 THEN h ELSE (h -> 0) || (SELECT jsonb_agg(x ORDER BY i) FROM jsonb_array_elements(h) WITH ORDINALITY AS t(x, i) WHERE i > jsonb_array_length(h) - 19) END FROM (SELECT d.history || jsonb_build_array(jsonb_build_object('reason', d.reason, 'attempts', d.attempts, 'replaced_at', now())) AS h) AS p)
WHERE subscription = $1 AND event_id = $2 AND created_at = $3`, q),
		deadLetterDelete: fmt.Sprintf(`DELETE FROM %s.dead_letters WHERE subscription = $1 AND event_id = $2`, q),

		// Store.ParkStream, after the letter's insert in the same
		// transaction: the row from the letter's event ($2). A stream
		// parked already is parked again only by a letter beyond what its
		// release has done (a released event dead-lettered again), or by
		// the same letter (a retried write): otherwise nothing is returned.
		parkAdd: fmt.Sprintf(`INSERT INTO %[1]s.parked_streams AS p (subscription, stream_name, cg_hash,
  event_id, position, version, done_version, reason)
SELECT $1, e.stream_name, e.cg_hash, e.event_id, $3, e.version, e.version, $4 FROM %[1]s.events e WHERE e.event_id = $2
ON CONFLICT (subscription, stream_name) DO UPDATE SET event_id = excluded.event_id, position = excluded.position, version = excluded.version,
  done_version = excluded.done_version, reason = excluded.reason, action = NULL, requested_at = NULL
WHERE p.event_id = excluded.event_id OR (p.action IN ('replay', 'discard') AND excluded.version > p.done_version)
RETURNING `+parkedColumns, q),
		// The parked streams of $1, by stream: of bucket $3 of a $2-bucket
		// generation when $2 > 0; stream $4 alone when not ''; with $7
		// only those a release is asked for; after the cursor $5. Waiting comes from the stream's row (its last
		// version), not from counting events.
		parkList: fmt.Sprintf(`SELECT `+parkedColumns+` FROM %[1]s.parked_streams p
WHERE p.subscription = $1 AND ($2::int = 0 OR %[1]s.cg_bucket(p.cg_hash, $2) = $3) AND ($4::text = '' OR p.stream_name = $4)
  AND (NOT $7::bool OR p.action IN ('replay', 'discard')) AND p.stream_name > $5
ORDER BY p.stream_name LIMIT $6`, q),
		// An operator's request, on a row that is parked and nothing
		// else; a replay makes the letter's own event due again.
		parkRequest: fmt.Sprintf(`UPDATE %[1]s.parked_streams p SET action = $3, requested_at = now(),
  done_version = CASE WHEN $3 = 'replay' THEN p.version - 1 ELSE p.done_version END
WHERE p.subscription = $1 AND p.stream_name = $2 AND p.action IS NULL
RETURNING `+parkedColumns, q),
		parkDiscardLetter: fmt.Sprintf(`DELETE FROM %s.dead_letters WHERE subscription = $1 AND event_id = $2`, q),
		// A reader's release step on a row being released in its bucket
		// ($4 of a $3-bucket generation): done_version moves forward to
		// $5; with $6 the row goes (only once the letter's event is done).
		// Once a replay's done_version reaches the letter's event, the
		// letter is marked replayed, in the same statement.
		parkRelease: fmt.Sprintf(`WITH u AS (
UPDATE %[1]s.parked_streams p SET done_version = GREATEST(p.done_version, $5)
WHERE p.subscription = $1 AND p.stream_name = $2 AND p.action IN ('replay', 'discard')
  AND %[1]s.cg_bucket(p.cg_hash, $3) = $4 AND NOT $6
RETURNING p.*), x AS (
DELETE FROM %[1]s.parked_streams p
WHERE p.subscription = $1 AND p.stream_name = $2 AND p.action IN ('replay', 'discard')
  AND %[1]s.cg_bucket(p.cg_hash, $3) = $4 AND $6 AND GREATEST(p.done_version, $5) >= p.version
RETURNING p.*), r AS (
SELECT * FROM u
UNION ALL
SELECT subscription, stream_name, cg_hash, event_id, position, version, GREATEST(done_version, $5),
  reason, parked_at, action, requested_at FROM x), m AS (
UPDATE %[1]s.dead_letters l SET replayed_at = now() FROM r
WHERE l.subscription = $1 AND l.event_id = r.event_id AND r.action = 'replay' AND r.done_version >= r.version AND l.replayed_at IS NULL)
SELECT `+parkedColumns+` FROM r p`, q),
		// Whether the letter of event $2 parks its stream for $1.
		parkHeldBy: fmt.Sprintf(`SELECT EXISTS (SELECT FROM %[1]s.parked_streams WHERE subscription = $1 AND event_id = $2)`, q),
		// Why a change found no row: the row as it is, if any.
		parkState: fmt.Sprintf(`SELECT `+parkedColumns+` FROM %[1]s.parked_streams p WHERE p.subscription = $1 AND p.stream_name = $2`, q),

		indexState: `SELECT i.indisvalid FROM pg_catalog.pg_index i
JOIN pg_catalog.pg_class c ON c.oid = i.indexrelid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relname = $2`,

		// Store.LockCheckpointTx: lock (subscription, bucket)'s checkpoint
		// row until the end of the transaction, inserting it at 0 if
		// missing, and return its position. A concurrent holder of the
		// lock makes it wait, then see that holder's committed position
		// (READ COMMITTED re-reads the row it updates).
		checkpointLock: fmt.Sprintf(`INSERT INTO %[1]s.checkpoints AS c (subscription, bucket, position) VALUES ($1, $2, 0)
ON CONFLICT (subscription, bucket) DO UPDATE SET position = c.position RETURNING position`, q),

		// The operator's reads (Store.ProgressTx, Store.Subscriptions,
		// Store.KnowsSubscription): the database's clock and the head;
		// every subscription of the checkpoints and dead letters, with
		// its stored checkpoints and pending dead letters; the events of a
		// category, sequenced or not; whether one subscription has
		// checkpoints or dead letters.
		operatorNow: fmt.Sprintf(`SELECT now(), (SELECT last_position FROM %s.sequencer WHERE id = 1)`, q),
		subscriptionList: fmt.Sprintf(`WITH names AS (
    SELECT subscription FROM %[1]s.checkpoints
    UNION SELECT subscription FROM %[1]s.dead_letters
)
SELECT n.subscription,
    (SELECT count(*) FROM %[1]s.checkpoints c WHERE c.subscription = n.subscription
        AND c.bucket / %[2]d = (SELECT max(l.bucket / %[2]d) FROM %[1]s.checkpoints l WHERE l.subscription = n.subscription)),
    (SELECT count(*) FROM %[1]s.dead_letters d WHERE d.subscription = n.subscription AND d.replayed_at IS NULL)
FROM names n
ORDER BY n.subscription`, q, MaxGroupSize),
		categoryCount: fmt.Sprintf(`SELECT count(*) FROM %s.events WHERE category = $1`, q),
		subscriptionKnown: fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM %[1]s.checkpoints WHERE subscription = $1)
    OR EXISTS (SELECT 1 FROM %[1]s.dead_letters WHERE subscription = $1)`, q),
	}
}

// Statements that depend on a group size or an index name, built when
// needed, and those without the schema.
const (
	// advisoryTryLock takes a session advisory lock if it is free.
	advisoryTryLock = `SELECT pg_try_advisory_lock($1)`
	// advisoryUnlock releases a session advisory lock.
	advisoryUnlock = `SELECT pg_advisory_unlock($1)`
)

// bucketRead is the read of a bucket of a group of size (Store.ReadBucket):
// its ranges, written so that only the consumer-group index (category,
// bucket, last_position) on appends can serve them, as one ordered range
// scan from the cursor to the end of the bucket, joined to their events
// (see rangeRead):
//
//   - the bucket expression is written out with size as a literal, as in
//     the index;
//   - "(bucket, last_position) > ($2, $3) AND bucket <= $2" means "bucket =
//     $2 AND last_position > $3", but no other index can serve it: given
//     the plain form, the planner may prefer the global position index and
//     filter out the other buckets' ranges (every range of the category
//     read once per bucket). (A row comparison over all three index
//     columns would not do: the btree would start each page at the
//     bucket's first entry.);
//   - ORDER BY bucket, last_position is the index's order (bucket is
//     constant in the result);
//   - "last_position IS NOT NULL" matches the partial index's predicate,
//     which the planner cannot infer from a row comparison.
func bucketRead(q string, size int) readSQL {
	m := bucketExpr("a.cg_hash", size)
	return rangeRead(q, fmt.Sprintf(`a.category = $1 AND (%[1]s, a.last_position) > ($2, $3) AND %[1]s <= $2
  AND a.last_position IS NOT NULL`, m), m+", a.last_position", 3, 4)
}

// bucketLag counts at most $4 events of a bucket of a group of size after
// the position $3 and up to $5, and the oldest one's time
// (Store.BucketLagUntil): the bucket read's ranges (see bucketRead), one
// range scan of the consumer-group index, which no other index can serve,
// without reading the events: the first $4 ranges hold at least min($4,
// the backlog) events, a range's time is its events', and a range that
// straddles $3 or $5 counts only its events between them.
func bucketLag(q string, size int) string {
	m := bucketExpr("cg_hash", size)
	return fmt.Sprintf(`SELECT LEAST(coalesce(sum(n), 0), $4::bigint)::bigint, min(recorded_at) FROM (
  SELECT GREATEST(LEAST(last_position, $5::bigint) - GREATEST(last_position - last_version + first_version, $3 + 1) + 1, 0) AS n, recorded_at
  FROM %[1]s.appends
  WHERE category = $1 AND (%[2]s, last_position) > ($2, $3) AND %[2]s <= $2 AND last_position IS NOT NULL
    AND last_position - last_version + first_version <= $5::bigint
  ORDER BY %[2]s, last_position LIMIT $4::bigint) lag`, q, m)
}

// bucketLagsSQL measures many buckets' backlogs in one statement
// (Store.BucketLags): per group size in sizes, a branch over the arrays of
// its buckets' indexes in the request, subscriptions, categories, slots,
// buckets and upper bounds ($2 to $7 for the first size, $8 to $13 for the
// next, …), each bucket's checkpoint joined, and bucketLag's count after
// it (at most $1 events), as a lateral scan of the consumer-group index
// per bucket.
func bucketLagsSQL(q string, sizes []int) string {
	var parts []string
	for i, size := range sizes {
		m := bucketExpr("a.cg_hash", size)
		p := 2 + 6*i
		parts = append(parts, fmt.Sprintf(`SELECT r.i, coalesce(c.position, 0)::bigint, l.n, l.oldest
FROM unnest($%[3]d::int[], $%[4]d::text[], $%[5]d::text[], $%[6]d::int[], $%[7]d::int[], $%[8]d::bigint[])
  AS r(i, subscription, category, slot, bucket, until)
LEFT JOIN %[1]s.checkpoints c ON c.subscription = r.subscription AND c.bucket = r.slot
CROSS JOIN LATERAL (SELECT LEAST(coalesce(sum(x.n), 0), $1::bigint)::bigint AS n, min(x.recorded_at) AS oldest FROM (
  SELECT GREATEST(LEAST(a.last_position, r.until) - GREATEST(a.last_position - a.last_version + a.first_version, coalesce(c.position, 0) + 1) + 1, 0) AS n,
    a.recorded_at
  FROM %[1]s.appends a
  WHERE a.category = r.category AND (%[2]s, a.last_position) > (r.bucket, coalesce(c.position, 0)) AND %[2]s <= r.bucket
    AND a.last_position IS NOT NULL AND a.last_position - a.last_version + a.first_version <= r.until
  ORDER BY %[2]s, a.last_position LIMIT $1::bigint) x) l`, q, m, p, p+1, p+2, p+3, p+4, p+5))
	}
	return strings.Join(parts, "\nUNION ALL\n")
}

// createConsumerGroupIndex builds the consumer-group index of a group of
// n, named name, on the ranges, without blocking appends. Partial: a range
// enters the index when it gets its position, not before (one index write
// per append, not two). The planner has no statistics for the expression
// of a partial index, which is why the bucket read is written so that no
// other index can serve it.
func createConsumerGroupIndex(q, name string, n int) string {
	return fmt.Sprintf("CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s.appends (category, %s, last_position) WHERE last_position IS NOT NULL",
		pgx.Identifier{name}.Sanitize(), q, bucketExpr("cg_hash", n))
}

// dropIndex drops an index (qname, quoted with its schema) left invalid
// by an interrupted build.
func dropIndex(qname string) string { return "DROP INDEX CONCURRENTLY IF EXISTS " + qname }

// listen is the statement that subscribes the notifier's connection to a
// channel; the name is quoted as an identifier, so any name is safe.
func listen(channel string) string { return "LISTEN " + pgx.Identifier{channel}.Sanitize() }
