package inspect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// Inspection is a read-only view of one subscription: the demo's screen,
// `kumi status` and the console show it.
//
// It reads the leases with leasestore.ReadSnapshotTx, not
// leasestore.Store.Snapshot: a leasestore.Store joins the pool as a worker
// when it is created, and an observer that joins changes every worker's
// fair share.
type Inspection struct {
	// Schema and Subscription are the ones inspected.
	Schema       string
	Subscription string
	// Category is the one given to Inspect; "" when lag was not measured.
	Category string
	// Now is the database's clock; every time here is judged against it.
	Now time.Time
	// Head is the store's last sequenced global position.
	Head int64
	// Buckets is the subscription's N (0 when it has no lease rows yet):
	// the serving generation's.
	Buckets int
	// Resize is the subscription's generation and resize, with each
	// bucket's part while one runs (leasestore.ReadResizeTx); zero when
	// the subscription has no subscriptions row (no worker started it).
	Resize leasestore.Resize
	// Workers are the subscription's worker rows, live or not, by worker
	// id.
	Workers []leasestore.WorkerState
	// Rows are the buckets, by slot: the serving generation's, and during
	// a resize the next one's after them.
	Rows []BucketRow
	// Checkpoints are the subscription's stored checkpoints, every
	// generation's, by slot (a Checkpoint's Bucket is its slot); the
	// retired generations' are here alone, as their lease rows are gone
	// ([Inspection.Generations]).
	Checkpoints []eventsource.Checkpoint
	// Standby reports that the store's database is a hot standby: what it
	// shows is as of its replay, and a session-kind worker's advisory
	// lock, held on the primary, is invisible there, so SessionGone is
	// left false for every worker (SessionUnknown).
	Standby bool
	// SessionUnknown reports workers of the session kind whose lock could
	// not be checked (Standby).
	SessionUnknown bool
	// CategoryEmpty reports a Category with no events at all, on a
	// subscription that has handled none yet: its lag of 0 means nothing
	// to read, which a mistyped category also shows. Categories are some
	// of the categories that have events then. (A category with no events
	// on a subscription that has handled some is refused: [CategoryError].)
	CategoryEmpty bool
	Categories    []string
	// Parked are the subscription's parked streams (docs/design/parking.md),
	// by stream name, at most MaxParkedShown of them; ParkedMore reports
	// that more are parked. A stream's bucket in the serving generation is
	// eventsource.BucketOfHash(p.Hash, Buckets).
	Parked     []eventsource.ParkedStream
	ParkedMore bool
}

// MaxParkedShown is how many parked streams an Inspection lists.
const MaxParkedShown = 100

// BucketRow is one bucket: its lease row and its checkpoint.
type BucketRow struct {
	// BucketState is the lease row, as leasestore.Store.Snapshot reports it.
	leasestore.BucketState
	// Live reports an owner whose lease is unexpired at Inspection.Now.
	Live bool
	// Checkpoint is the stored position (0 when none), CheckpointAt when
	// it was last written (zero when none).
	Checkpoint   int64
	CheckpointAt time.Time
	// Lag is the number of the category's events of this bucket after the
	// checkpoint — for a bucket of a generation that a decided cut ends,
	// up to the cut — or -1 when no category was given (or for a bucket
	// of the next generation on standby, which has nothing to do yet).
	Lag int64
	// Oldest is when the oldest of those events was recorded (zero when
	// there are none).
	Oldest time.Time
}

// LiveWorkers counts the workers that are live and, for session kind,
// whose session still holds its lock.
func (in Inspection) LiveWorkers() int {
	n := 0
	for _, w := range in.Workers {
		if w.Live && !w.SessionGone {
			n++
		}
	}
	return n
}

// OwnedBy returns how many buckets each live owner holds.
func (in Inspection) OwnedBy() map[string]int {
	out := map[string]int{}
	for _, r := range in.Rows {
		if r.Live {
			out[r.Owner]++
		}
	}
	return out
}

// ErrNotMigrated reports a schema without kumi's tables.
var ErrNotMigrated = errors.New("the schema has no kumi tables")

// notMigrated turns "relation/schema does not exist" into ErrNotMigrated.
func notMigrated(schema string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("schema %q: %w (run `kumi migrate` first, or pass the right --schema): %s",
			schema, ErrNotMigrated, pgErr.Message)
	}
	return err
}

// Inspect reads one subscription's workers, buckets and checkpoints in one
// read-only repeatable-read transaction (leasestore.ReadSnapshotTx and
// eventsource.Store.ProgressTx, leasestore.ReadResizeTx), and — when
// category is not "" — each bucket's lag behind its checkpoint
// (eventsource.Store.BucketLagUntil, one query per bucket). It writes
// nothing and takes no lock a worker waits
// for.
func Inspect(ctx context.Context, store *eventsource.Store, subscription, category string) (Inspection, error) {
	return InspectReads(ctx, store, store, subscription, category)
}

// InspectReads is [Inspect] with the lag counts read through reads (a
// store on a hot standby of store's database, say: they are the heavy
// part), as of what reads shows; everything else is read through store.
func InspectReads(ctx context.Context, store, reads *eventsource.Store, subscription, category string) (Inspection, error) {
	if err := eventsource.ValidateSubscription(subscription); err != nil {
		return Inspection{}, err
	}
	if category != "" {
		if err := eventsource.ValidateCategory(category); err != nil {
			return Inspection{}, err
		}
	}
	in := Inspection{Schema: store.Schema(), Subscription: subscription, Category: category}
	var snap leasestore.Snapshot
	var progress eventsource.Progress
	err := pgx.BeginTxFunc(ctx, store.Pool(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			if progress, err = store.ProgressTx(ctx, tx, subscription); err != nil {
				return err
			}
			if snap, err = leasestore.ReadSnapshotTx(ctx, tx, store.Schema(), subscription); err != nil {
				return err
			}
			in.Resize, err = leasestore.ReadResizeTx(ctx, tx, store.Schema(), subscription)
			if errors.Is(err, leasestore.ErrNoSubscription) {
				in.Resize, err = leasestore.Resize{}, nil
			}
			if err != nil {
				return err
			}
			return tx.QueryRow(ctx, "SELECT pg_is_in_recovery()").Scan(&in.Standby)
		})
	if err != nil {
		return Inspection{}, notMigrated(store.Schema(), err)
	}
	in.Now, in.Head, in.Workers, in.Checkpoints = progress.Now, progress.Head, snap.Workers, progress.Checkpoints
	if in.Standby {
		// pg_locks on a standby shows none of the primary's advisory locks:
		// every session worker would look gone.
		for i := range in.Workers {
			if in.Workers[i].Kind == leasestore.KindSession {
				in.Workers[i].SessionGone = false
				in.SessionUnknown = true
			}
		}
	}
	if in.Parked, err = store.ParkedStreams(ctx, subscription, eventsource.ParkedFilter{Limit: MaxParkedShown + 1}); err != nil {
		return Inspection{}, notMigrated(store.Schema(), err)
	}
	if len(in.Parked) > MaxParkedShown {
		in.Parked, in.ParkedMore = in.Parked[:MaxParkedShown], true
	}
	checkpoints := make(map[int]eventsource.Checkpoint, len(progress.Checkpoints))
	for _, c := range progress.Checkpoints {
		checkpoints[c.Bucket] = c
	}
	in.Rows = make([]BucketRow, len(snap.Buckets))
	for i, b := range snap.Buckets {
		c := checkpoints[b.Slot]
		in.Rows[i] = BucketRow{BucketState: b, Live: b.Held(in.Now), Checkpoint: c.Position, CheckpointAt: c.UpdatedAt, Lag: -1}
		if b.Generation == in.Resize.Generation {
			in.Buckets = max(in.Buckets, b.BucketCount)
		}
	}
	if category == "" {
		return in, nil
	}
	if err := checkCategory(ctx, reads, &in); err != nil {
		return in, err
	}
	for i := range in.Rows {
		r := &in.Rows[i]
		until := int64(math.MaxInt64)
		switch {
		case r.Generation > in.Resize.Generation && !in.Resize.CutDecided:
			continue // standby: nothing to do yet
		case r.Generation == in.Resize.Generation && in.Resize.Resizing() && in.Resize.CutDecided:
			until = in.Resize.Cut
		}
		n, oldest, err := reads.BucketLagUntil(ctx, category, r.Bucket, r.BucketCount, r.Checkpoint, until)
		if err != nil {
			return in, fmt.Errorf("lag of bucket %d: %w", r.Bucket, notMigrated(reads.Schema(), err))
		}
		r.Lag, r.Oldest = n, oldest
	}
	return in, nil
}

// ReplicaStatus is how far a hot standby is behind its primary.
type ReplicaStatus struct {
	// PrimaryHead and StandbyHead are the last sequenced positions each
	// shows; LagEvents their difference, the sequenced events the standby
	// does not show yet.
	PrimaryHead int64 `json:"primary_head"`
	StandbyHead int64 `json:"standby_head"`
	LagEvents   int64 `json:"lag_events"`
	// LagBytes is the WAL the primary has written that the standby has not
	// replayed.
	LagBytes int64 `json:"lag_bytes"`
	// ReplayedAt is the primary's commit time of the last transaction the
	// standby replayed (zero before the first); it ages while the primary
	// is idle, so read it with LagEvents.
	ReplayedAt time.Time `json:"replayed_at"`
	// ReplayPaused reports pg_wal_replay_pause() in effect.
	ReplayPaused bool `json:"replay_paused"`
	// Now is the primary's clock when it was measured, to judge
	// ReplayedAt against.
	Now time.Time `json:"-"`
}

// ErrNotStandby reports a read database that is not a hot standby.
var ErrNotStandby = errors.New("the read database is not a hot standby (pg_is_in_recovery() is false)")

// Replica measures how far standby, a store on a hot standby, is behind
// primary; [ErrNotStandby] when it is not one.
func Replica(ctx context.Context, primary, standby *eventsource.Store) (ReplicaStatus, error) {
	var st ReplicaStatus
	var err error
	var lsn string
	if err := primary.Pool().QueryRow(ctx, "SELECT pg_current_wal_lsn()::text, now()").Scan(&lsn, &st.Now); err != nil {
		return st, err
	}
	if st.PrimaryHead, err = primary.HeadPosition(ctx); err != nil {
		return st, notMigrated(primary.Schema(), err)
	}
	var inRecovery bool
	var replayed *time.Time
	err = standby.Pool().QueryRow(ctx, `SELECT pg_is_in_recovery(),
		coalesce(greatest(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 0), 0)::bigint,
		pg_last_xact_replay_timestamp(),
		CASE WHEN pg_is_in_recovery() THEN pg_get_wal_replay_pause_state() <> 'not paused' ELSE false END`, lsn).
		Scan(&inRecovery, &st.LagBytes, &replayed, &st.ReplayPaused)
	switch {
	case err != nil:
		return st, err
	case !inRecovery:
		return st, ErrNotStandby
	}
	if replayed != nil {
		st.ReplayedAt = *replayed
	}
	if st.StandbyHead, err = standby.HeadPosition(ctx); err != nil {
		return st, notMigrated(standby.Schema(), err)
	}
	st.LagEvents = max(st.PrimaryHead-st.StandbyHead, 0)
	return st, nil
}

// SubscriptionSummary is one subscription of a schema, for an overview.
// Its JSON form is what `kumi status --json` and the console print.
type SubscriptionSummary struct {
	Subscription string `json:"subscription"`
	Buckets      int    `json:"buckets"`              // N; 0 when it has checkpoints but no lease rows
	Held         int    `json:"held"`                 // buckets with a live owner
	LiveWorkers  int    `json:"live_workers"`         // live workers
	Checkpoints  int    `json:"checkpoints"`          // buckets with a stored checkpoint, in the latest generation that has any
	DeadLetters  int    `json:"pending_dead_letters"` // pending dead letters
	// Resize says a running resize's counts and state ("8 → 32, switched");
	// "" when none runs.
	Resize string `json:"resize,omitempty"`
}

// Subscriptions lists every subscription that has lease rows, checkpoints
// or dead letters in the store's schema, sorted by name: the lease
// table's (leasestore.ListSubscriptionsTx) and the store's
// (eventsource.Store.SubscriptionsTx), with each one's running resize
// (leasestore.ReadResizeTx), read in one read-only repeatable-read
// transaction.
func Subscriptions(ctx context.Context, store *eventsource.Store) ([]SubscriptionSummary, error) {
	return SubscriptionsReads(ctx, store, store)
}

// SubscriptionsReads is [Subscriptions] with the checkpoint and dead
// letter counts (eventsource.Store.Subscriptions, the heavy part) read
// through reads — a store on a hot standby of store's database, say — as
// of what reads shows; the leases and resizes are read through store.
func SubscriptionsReads(ctx context.Context, store, reads *eventsource.Store) ([]SubscriptionSummary, error) {
	var leases []leasestore.SubscriptionLeases
	var stats []eventsource.SubscriptionStats
	resizing := map[string]string{}
	err := pgx.BeginTxFunc(ctx, store.Pool(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			if leases, err = leasestore.ListSubscriptionsTx(ctx, tx, store.Schema()); err != nil {
				return err
			}
			for _, l := range leases {
				r, err := leasestore.ReadResizeTx(ctx, tx, store.Schema(), l.Subscription)
				switch {
				case errors.Is(err, leasestore.ErrNoSubscription):
				case err != nil:
					return err
				case r.Resizing():
					resizing[l.Subscription] = fmt.Sprintf("%d → %d, %s", r.Buckets, r.NextBuckets, r.State)
				}
			}
			if reads == store {
				stats, err = store.SubscriptionsTx(ctx, tx)
			}
			return err
		})
	if err != nil {
		return nil, notMigrated(store.Schema(), err)
	}
	if reads != store {
		if stats, err = reads.Subscriptions(ctx); err != nil {
			return nil, notMigrated(reads.Schema(), err)
		}
	}
	byName := map[string]*SubscriptionSummary{}
	summary := func(name string) *SubscriptionSummary {
		if s, ok := byName[name]; ok {
			return s
		}
		s := &SubscriptionSummary{Subscription: name}
		byName[name] = s
		return s
	}
	for _, l := range leases {
		s := summary(l.Subscription)
		s.Buckets, s.Held, s.LiveWorkers = l.Buckets, l.Held, l.LiveWorkers
		s.Resize = resizing[l.Subscription]
	}
	for _, st := range stats {
		s := summary(st.Subscription)
		s.Checkpoints, s.DeadLetters = st.Checkpoints, st.DeadLetters
	}
	out := make([]SubscriptionSummary, 0, len(byName))
	for _, s := range byName {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b SubscriptionSummary) int { return strings.Compare(a.Subscription, b.Subscription) })
	return out, nil
}

// Known reports whether the store's schema knows a subscription — it has
// lease rows, checkpoints or dead letters — and its bucket count N (0
// when it has no lease rows, which alone record N).
func Known(ctx context.Context, store *eventsource.Store, subscription string) (buckets int, known bool, err error) {
	buckets, err = leasestore.BucketCount(ctx, store.Pool(), store.Schema(), subscription)
	if err != nil {
		return 0, false, notMigrated(store.Schema(), err)
	}
	if buckets > 0 {
		return buckets, true, nil
	}
	known, err = store.KnowsSubscription(ctx, subscription)
	if err != nil {
		return 0, false, notMigrated(store.Schema(), err)
	}
	return 0, known, nil
}
