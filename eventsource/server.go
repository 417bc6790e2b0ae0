package eventsource

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/kumierr"
)

// ServerIdentity names the history of the PostgreSQL server a store's
// primary is: its cluster and its timeline. A failover shows as a new
// timeline (a promoted standby starts one), a store moved to another
// cluster as a new system identifier. Positions handed out under one
// identity mean nothing under another: the promoted standby may lack the
// old primary's last commits and hand their positions out again, to other
// events (docs/design/eventsource.md, "Failover").
type ServerIdentity struct {
	// System is the cluster's system identifier (pg_control_system()),
	// shared by a primary and its physical standbys; 0 when the role may
	// not read it (some hosted services revoke pg_control_system), in
	// which case only the timeline tells servers apart.
	System uint64
	// Timeline is the primary's WAL timeline (from
	// pg_walfile_name(pg_current_wal_lsn()), which shows a promotion at
	// once, unlike pg_control_checkpoint() before the next checkpoint).
	Timeline uint32
}

// String formats the identity as "system/timeline".
func (id ServerIdentity) String() string {
	return fmt.Sprintf("%d/%d", id.System, id.Timeline)
}

// ServerChangeReason says what showed a [ServerChange].
type ServerChangeReason string

// The reasons of a [ServerChange].
const (
	// ServerChangeSystem: another cluster (a different system identifier).
	ServerChangeSystem ServerChangeReason = "system"
	// ServerChangeTimeline: a new timeline of the same cluster, as after
	// a promotion.
	ServerChangeTimeline ServerChangeReason = "timeline"
	// ServerChangeHead: the same identity, but a head below a position
	// this process had seen (a restore that kept the timeline).
	ServerChangeHead ServerChangeReason = "head went back"
)

// ServerChange is a change of the server a store works on, as a process
// found it.
type ServerChange struct {
	Reason ServerChangeReason
	// Old and New are the identities before and after.
	Old, New ServerIdentity
	// HeadBefore is the highest position the process had seen before;
	// HeadAfter the head found on the new server, -1 when the look that
	// found the change read none (a notifier's connection). HeadAfter
	// below HeadBefore means positions are handed out again.
	HeadBefore, HeadAfter int64
	// At is when the process found it.
	At time.Time
}

// ServerEpoch is what a store knows of the server it works on.
type ServerEpoch struct {
	// Identity is the identity last seen; zero before the first look.
	Identity ServerIdentity
	// Epoch counts the changes found since the store was made (0: none).
	Epoch int64
	// Last is the last change found, nil if none.
	Last *ServerChange
	// Changed is closed at the next change: select on it to learn of a
	// failover without polling.
	Changed <-chan struct{}
}

// serverState is a store's record of its server: see observeServer.
type serverState struct {
	mu      sync.Mutex
	known   bool
	id      ServerIdentity
	head    int64 // the highest position seen under id
	epoch   int64
	last    *ServerChange
	changed chan struct{}
	// pending are changes found and not yet in the failover record (see
	// recordServerChanges); unrecorded tells without the lock.
	pending    []ServerChange
	unrecorded atomic.Bool
}

// Server returns what the store knows of its server: the identity its
// sequencer steps, notifier connections and [Store.CheckServer] last saw,
// and the changes found. Nothing here queries the database.
func (s *Store) Server() ServerEpoch {
	st := &s.server
	st.mu.Lock()
	defer st.mu.Unlock()
	return ServerEpoch{Identity: st.id, Epoch: st.epoch, Last: st.last, Changed: st.changedLocked()}
}

func (st *serverState) changedLocked() chan struct{} {
	if st.changed == nil {
		st.changed = make(chan struct{})
	}
	return st.changed
}

// CheckServer looks at the store's server now, through its pool: its
// identity and its head, compared with what the process saw before (see
// [Store.Server]). A change is logged at Warn, counted in the epoch, and
// closes the last [ServerEpoch]'s Changed.
func (s *Store) CheckServer(ctx context.Context) (ServerEpoch, error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return ServerEpoch{}, fmt.Errorf("kumi: check the server: %w", err)
	}
	defer c.Release()
	if _, err := s.lookAtServer(ctx, c.Conn()); err != nil {
		return ServerEpoch{}, err
	}
	if err := s.recordServerChanges(ctx); err != nil {
		return s.Server(), err
	}
	return s.Server(), nil
}

// SawPosition records that the process has seen position handed out (a
// reader read it, a notification announced it). A later look at the
// server whose head is below it counts as a change ([ServerChangeHead]).
func (s *Store) SawPosition(position int64) {
	st := &s.server
	st.mu.Lock()
	st.head = max(st.head, position)
	st.mu.Unlock()
}

// seenHead returns the highest position seen under the current identity,
// and the epoch it belongs to: taken before a read of the head, it is what
// that read must show, unless a change is recorded meanwhile (see
// observeServer).
func (s *Store) seenHead() (head, epoch int64) {
	s.server.mu.Lock()
	defer s.server.mu.Unlock()
	return s.server.head, s.server.epoch
}

// lookAtServer reads conn's server identity and head, and records them
// (observeServer); it reports whether that was a change.
func (s *Store) lookAtServer(ctx context.Context, conn *pgx.Conn) (bool, error) {
	seen, seenEpoch := s.seenHead()
	system, err := systemID(ctx, conn)
	if err != nil {
		return false, err
	}
	var wal string
	var head int64
	if err := conn.QueryRow(ctx, s.sql.serverLook).Scan(&wal, &head); err != nil {
		return false, fmt.Errorf("kumi: read the server's timeline and head: %w", err)
	}
	tl, err := walTimeline(wal)
	if err != nil {
		return false, err
	}
	return s.observeServer(ServerIdentity{System: system, Timeline: tl}, head, seen, seenEpoch), nil
}

// serverIdentity reads conn's server identity (no head: it needs no
// table of the store). It fails on a standby.
func serverIdentity(ctx context.Context, conn *pgx.Conn) (ServerIdentity, error) {
	system, err := systemID(ctx, conn)
	if err != nil {
		return ServerIdentity{}, err
	}
	var wal string
	if err := conn.QueryRow(ctx, `SELECT pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn())`).Scan(&wal); err != nil {
		return ServerIdentity{}, fmt.Errorf("kumi: read the server's timeline: %w", err)
	}
	tl, err := walTimeline(wal)
	return ServerIdentity{System: system, Timeline: tl}, err
}

// differs reports whether a and b are different servers: another
// timeline, or another system identifier where both are known.
func (a ServerIdentity) differs(b ServerIdentity) bool {
	return a.Timeline != b.Timeline || a.System != b.System && a.System != 0 && b.System != 0
}

// observeServer records that the server has identity id and head head
// (read after the process had seen positions up to seen, in epoch
// seenEpoch), and reports
// whether that is a change: another system identifier, another timeline,
// or a head below seen. Only positions seen before the read count: heads
// read concurrently may be recorded out of order, but a head read after a
// position was handed out is at least that position, on one server. The
// first look is no change. A head below 0 is not known (a look at the
// identity only). A look that began before a change recorded since
// compares no head: what it had seen was of the server before. A change
// is logged once, at Warn.
func (s *Store) observeServer(id ServerIdentity, head, seen, seenEpoch int64) bool {
	st := &s.server
	st.mu.Lock()
	if !st.known {
		st.known, st.id, st.head = true, id, max(st.head, head)
		st.mu.Unlock()
		return false
	}
	var reason ServerChangeReason
	switch {
	case id.System != st.id.System && id.System != 0 && st.id.System != 0:
		reason = ServerChangeSystem
	case id.Timeline != st.id.Timeline:
		reason = ServerChangeTimeline
	case head >= 0 && head < seen && seenEpoch == st.epoch:
		reason = ServerChangeHead
	default:
		if st.id.System == 0 {
			st.id.System = id.System
		}
		st.head = max(st.head, head)
		st.mu.Unlock()
		return false
	}
	ch := &ServerChange{Reason: reason, Old: st.id, New: id, HeadBefore: max(st.head, seen), HeadAfter: head, At: time.Now()}
	st.id, st.head, st.last = id, max(head, 0), ch
	st.pending = append(st.pending, *ch)
	st.unrecorded.Store(true)
	st.epoch++
	close(st.changedLocked())
	st.changed = make(chan struct{})
	epoch := st.epoch
	st.mu.Unlock()
	s.cfg.Logger.Warn("kumi: the event store's server changed (a failover?): positions seen before are not trusted",
		"reason", string(reason), "schema", s.cfg.Schema,
		"old_system", strconv.FormatUint(ch.Old.System, 10), "new_system", strconv.FormatUint(id.System, 10),
		"old_timeline", ch.Old.Timeline, "new_timeline", id.Timeline,
		"head_before", ch.HeadBefore, "head_after", head, "epoch", epoch)
	return true
}

// recordServerChanges writes the changes found and not yet recorded into
// the schema's failover record (table server_changes, through
// note_server_change, which merges the reports of one change by several
// processes), on a connection of the pool. What it could not write stays
// pending, for the next call: the sequencer's next step, or the next
// [Store.CheckServer].
func (s *Store) recordServerChanges(ctx context.Context) error {
	st := &s.server
	if !st.unrecorded.Load() {
		return nil
	}
	st.mu.Lock()
	todo := st.pending
	st.pending = nil
	st.unrecorded.Store(false)
	st.mu.Unlock()
	for i, ch := range todo {
		var after *int64
		if ch.HeadAfter >= 0 {
			after = &ch.HeadAfter
		}
		_, err := s.pool.Exec(ctx, s.sql.serverChangeNote, string(ch.Reason),
			strconv.FormatUint(ch.Old.System, 10), int64(ch.Old.Timeline),
			strconv.FormatUint(ch.New.System, 10), int64(ch.New.Timeline), ch.HeadBefore, after)
		if err != nil {
			st.mu.Lock()
			st.pending = append(todo[i:], st.pending...)
			st.unrecorded.Store(true)
			st.mu.Unlock()
			return fmt.Errorf("kumi: record the server change in the failover record: %w", err)
		}
	}
	return nil
}

// RecordedServerChange is one entry of the schema's failover record: a
// change of server that one or more processes found (docs/design/eventsource.md,
// "Failover").
type RecordedServerChange struct {
	ID int64
	// ServerChange is the change; At is when it was first recorded,
	// HeadBefore the highest position any process that found it had seen,
	// HeadAfter the lowest head one read on the new server (-1 when none
	// did).
	ServerChange
	// FoundBy is the first finder's application_name (its role when it
	// set none); Reports counts the processes that found it.
	FoundBy string
	Reports int
}

// Reused reports whether positions were handed out again: the new head
// was below a position seen on the old server. Events at positions
// HeadAfter+1 through HeadBefore of the old server may have been
// delivered and no longer exist; the new server's events at those
// positions are other events.
func (c RecordedServerChange) Reused() bool {
	return c.HeadAfter >= 0 && c.HeadAfter < c.HeadBefore
}

// ServerChanges reads the schema's failover record, newest first, at most
// limit entries (100 when limit is 0).
func (s *Store) ServerChanges(ctx context.Context, limit int) ([]RecordedServerChange, error) {
	if limit < 0 {
		return nil, &kumierr.ConfigError{Field: "eventsource.Store.ServerChanges limit", Value: limit, Reason: "must not be negative"}
	}
	if limit == 0 {
		limit = 100
	}
	rows, _ := s.pool.Query(ctx, s.sql.serverChangeList, limit)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (RecordedServerChange, error) {
		var c RecordedServerChange
		var reason, oldSys, newSys string
		var oldTL, newTL int64
		err := r.Scan(&c.ID, &c.At, &reason, &oldSys, &oldTL, &newSys, &newTL, &c.HeadBefore, &c.HeadAfter, &c.FoundBy, &c.Reports)
		if err != nil {
			return c, err
		}
		c.Reason = ServerChangeReason(reason)
		c.Old.Timeline, c.New.Timeline = uint32(oldTL), uint32(newTL)
		c.Old.System, _ = strconv.ParseUint(oldSys, 10, 64)
		c.New.System, _ = strconv.ParseUint(newSys, 10, 64)
		return c, nil
	})
	if err != nil {
		return nil, fmt.Errorf("kumi: read the failover record: %w", err)
	}
	return out, nil
}

// systemIDKey caches a connection's system identifier in its CustomData:
// it cannot change while the connection lives.
const systemIDKey = "kumi.system_identifier"

// systemID returns the system identifier of conn's server, read once per
// connection; 0 when the role may not execute pg_control_system.
func systemID(ctx context.Context, conn *pgx.Conn) (uint64, error) {
	data := conn.PgConn().CustomData()
	if v, ok := data[systemIDKey].(uint64); ok {
		return v, nil
	}
	var text string
	err := conn.QueryRow(ctx, `SELECT system_identifier::text FROM pg_catalog.pg_control_system()`).Scan(&text)
	var pgErr *pgconn.PgError
	var id uint64
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "42501": // insufficient_privilege
	case err != nil:
		return 0, fmt.Errorf("kumi: read the server's system identifier: %w", err)
	default:
		if id, err = strconv.ParseUint(text, 10, 64); err != nil {
			return 0, fmt.Errorf("kumi: read the server's system identifier %q: %w", text, err)
		}
	}
	data[systemIDKey] = id
	return id, nil
}

// walTimeline returns the timeline of a WAL file name (its first 8 hex
// digits).
func walTimeline(name string) (uint32, error) {
	if len(name) < 8 {
		return 0, fmt.Errorf("kumi: WAL file name %q: too short for a timeline", name)
	}
	tl, err := strconv.ParseUint(name[:8], 16, 32)
	if err != nil {
		return 0, fmt.Errorf("kumi: WAL file name %q: %w", name, err)
	}
	return uint32(tl), nil
}

// ErrServerChanged is wrapped by [*ServerChangedError].
var ErrServerChanged = errors.New("kumi: the event store's server changed")

// ServerChangedError reports a write refused by a [Store.ServerFence]: the
// store's server changed (see [Store.Server]) since the writer began, so
// what it read before — positions, handled marks — may name events the
// server now lacks, or hands out again to others. Nothing was written.
// The writer should drop what it holds and start again from what the
// store has now (a reader: from its stored checkpoint).
type ServerChangedError struct {
	// Epoch is the server epoch the writer began in, Now the store's.
	Epoch, Now int64
	// Server is the identity of the server the write went to.
	Server ServerIdentity
}

// Error says what was refused and why.
func (e *ServerChangedError) Error() string {
	return fmt.Sprintf("kumi: write refused: the event store's server changed (epoch %d, now %d, on server %s; a failover?): "+
		"nothing was written; start again from the stored checkpoint", e.Epoch, e.Now, e.Server)
}

// Unwrap returns [ErrServerChanged].
func (e *ServerChangedError) Unwrap() error { return ErrServerChanged }

// ServerFence returns a [Fence] that refuses a write, with a
// [*ServerChangedError], unless the store's server epoch ([ServerEpoch])
// is still epoch once the write's own server was looked at; then inner
// (nil: none) checks it. The look happens in the write's transaction, on
// its connection, so no write from before a failover lands on the new
// primary, even one made before anything else in the process noticed.
// It costs a query per connection (a read-write connection's server
// keeps its identity while it lives), none after.
func (s *Store) ServerFence(epoch int64, inner Fence) Fence {
	return FenceFunc(func(ctx context.Context, tx pgx.Tx) error {
		id, err := connIdentity(ctx, tx.Conn())
		if err != nil {
			return err
		}
		s.observeServer(id, -1, 0, 0)
		if now := s.Server().Epoch; now != epoch {
			return &ServerChangedError{Epoch: epoch, Now: now, Server: id}
		}
		if inner == nil {
			return nil
		}
		return inner.Check(ctx, tx)
	})
}

// serverIdentityKey caches a connection's server identity in its
// CustomData, once read: a server's timeline changes only when it is
// promoted, and pg_current_wal_lsn fails on a standby, so a connection
// that read one keeps it while it lives.
const serverIdentityKey = "kumi.server_identity"

// connIdentity is serverIdentity, read once per connection.
func connIdentity(ctx context.Context, conn *pgx.Conn) (ServerIdentity, error) {
	data := conn.PgConn().CustomData()
	if id, ok := data[serverIdentityKey].(ServerIdentity); ok {
		return id, nil
	}
	id, err := serverIdentity(ctx, conn)
	if err == nil {
		data[serverIdentityKey] = id
	}
	return id, err
}
