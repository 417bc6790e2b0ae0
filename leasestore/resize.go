package leasestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
)

// A subscription's bucket count changes online by generations
// (docs/design/resize.md): a resize adds generation g+1 with M buckets beside the
// serving generation g with N, the holders of g's buckets agree on a cut
// position C, each of g's buckets drains to C, and bucket j of g+1 starts
// after C once the buckets of g that feed it have drained. A bucket's
// lease row and checkpoint are keyed by its slot, eventsource.Slot(g, b).

// ResizeState is the state of a subscription's resize.
type ResizeState string

// The states of a subscription (docs/design/resize.md, the protocol).
const (
	// ResizeSteady: one generation serves; no resize runs.
	ResizeSteady ResizeState = "steady"
	// ResizeSealing: a resize was requested; the holders of the serving
	// generation's buckets propose bounds.
	ResizeSealing ResizeState = "sealing"
	// ResizeCut: the cut C is decided; the old buckets drain to it.
	ResizeCut ResizeState = "cut"
	// ResizeSwitched: a new bucket is ready (its feeders drained); the
	// resize can no longer be cancelled.
	ResizeSwitched ResizeState = "switched"
)

// ResizeRequest asks for a subscription's bucket count to change.
type ResizeRequest struct {
	Subscription string // the subscription; a worker must have started it
	Buckets      int    // M, the new bucket count, in [1, MaxBuckets]
	By           string // who asks, shown by status ("" = unknown); a worker id's rules (Config.Worker)
	// EvictOldWorkers resizes although workers of a kumi version that
	// predates resizes (protocol 1) are live: they are fenced out (their
	// next heartbeat fails with KU001) and their buckets move after a TTL.
	EvictOldWorkers bool
}

// Resize is a subscription's generation and resize as the database has them.
type Resize struct {
	Subscription string // the subscription
	// ID names the resize in force, or the last one when steady (0: the
	// subscription was never resized). Each request takes the next id of
	// its subscription; what a worker learns of a resize (a [Bound], a
	// proposal's answer) names it, so that an answer about one resize is
	// never taken for another's.
	ID          int64
	Generation  int         // the serving generation g
	Buckets     int         // its bucket count N
	State       ResizeState // ResizeSteady when no resize runs
	NextBuckets int         // M while a resize runs; 0 when steady
	Cut         int64       // C, once decided (CutDecided)
	CutDecided  bool        // the state is ResizeCut or ResizeSwitched
	// Old is the serving generation's buckets while a resize runs, New the
	// next generation's, each sorted by bucket; both nil when steady, and
	// nil in PassResult.Resize.
	Old, New []SlotStatus
	// RequestedAt and SwitchedAt are database times (zero: never); they
	// stay after completion, for the last resize.
	RequestedAt, SwitchedAt time.Time
	RequestedBy             string // who requested the last resize
}

// Resizing reports whether a resize runs.
func (r Resize) Resizing() bool { return r.State != ResizeSteady && r.State != "" }

// SlotStatus is one bucket of a generation during a resize.
type SlotStatus struct {
	Bucket   int    // the bucket within its generation
	Slot     int    // eventsource.Slot(generation, Bucket)
	Owner    string // "" when free (a drained bucket has none)
	Epoch    int64  // its lease's epoch
	Proposal int64  // an old bucket's cut proposal; -1: none
	Drained  bool   // an old bucket drained to the cut
	Ready    bool   // a new bucket whose feeders all drained (after the switch)
}

// Bound is how far the reader of an old bucket may deliver during a resize
// ([Store.ProposeCut]; a lease's row carries it too, [Lease.Bound]).
type Bound struct {
	// Resize is the [Resize.ID] of the resize the bound belongs to (0:
	// unknown). With Resizing false, the resize it names is over for the
	// bucket (cancelled, or not the one in force).
	Resize int64
	// Resizing: a resize bounds the bucket. False: deliver without bound
	// (no resize, or it was cancelled).
	Resizing bool
	// Limit is the highest position the reader may deliver: the bucket's
	// proposal, or the cut C once Decided.
	Limit int64
	// Decided: Limit is the cut; the reader drains to it and calls
	// [Store.DrainTx].
	Decided bool
}

// indexName is the consumer-group index of n buckets that the event store
// builds (eventsource.Store.EnsureConsumerGroupIndex).
func indexName(n int) string { return fmt.Sprintf("events_cg_%d", n) }

// gcd is the greatest common divisor of two positive counts.
func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// Feeders returns the buckets of a generation of n buckets that feed
// bucket j of the next generation of m buckets: those congruent to j
// modulo gcd(n, m). Every stream of new bucket j was in one of them.
func Feeders(n, m, j int) []int {
	d := gcd(n, m)
	var out []int
	for i := j % d; i < n; i += d {
		out = append(out, i)
	}
	return out
}

// subscriptionRow is a row of the subscriptions table.
type subscriptionRow struct {
	generation, buckets, next int
	state                     ResizeState
	cut                       *int64
	requestedAt, switchedAt   *time.Time
	requestedBy               string
	id                        int64 // resize_id
}

func (r subscriptionRow) scan(row pgx.Row) (subscriptionRow, error) {
	var state string
	err := row.Scan(&r.generation, &r.buckets, &state, &r.next, &r.cut, &r.requestedAt, &r.requestedBy, &r.switchedAt,
		&r.id)
	r.state = ResizeState(state)
	return r, err
}

func (r subscriptionRow) resize(subscription string) Resize {
	out := Resize{Subscription: subscription, ID: r.id, Generation: r.generation, Buckets: r.buckets, State: r.state,
		NextBuckets: r.next, RequestedAt: orZero(r.requestedAt), SwitchedAt: orZero(r.switchedAt),
		RequestedBy: r.requestedBy}
	if r.cut != nil {
		out.Cut, out.CutDecided = *r.cut, true
	}
	return out
}

// lockSubscription reads the subscriptions row FOR UPDATE: the first lock
// of every resize transition (docs/design/resize.md, lock order).
func lockSubscription(ctx context.Context, tx pgx.Tx, st statements, subscription string) (subscriptionRow, error) {
	r, err := subscriptionRow{}.scan(tx.QueryRow(ctx, st.get("resize_lock"), subscription))
	if errors.Is(err, pgx.ErrNoRows) {
		return r, fmt.Errorf("%w: %q", ErrNoSubscription, subscription)
	}
	return r, err
}

// RequestResize asks for subscription's bucket count to become
// req.Buckets, in one transaction: it validates M, locks the subscription,
// checks that the consumer-group index for M is valid and that no worker
// of an older kumi version is live, and writes the resize (state sealing,
// the next generation's lease rows). It returns at once: the workers do
// the resize, learning of it by notification or on their next pass, and
// [ReadResize] follows it. Build the index first
// (eventsource.Store.EnsureConsumerGroupIndex), as actors.Resize does.
//
// Refusals, each with nothing written: M outside [1, MaxBuckets], or the
// generation limit reached (a *[kumierr.ConfigError] naming Buckets); By with
// control characters or too long (a *[kumierr.ConfigError] naming By); M = N
// ([ErrSameBuckets]); no such subscription ([ErrNoSubscription]); a
// resize running (*[ResizeInProgressError]); the index missing or invalid
// (a *[kumierr.ConfigError] naming Buckets, wrapping [ErrIndexMissing]); live protocol-1 workers without EvictOldWorkers
// (*[OldWorkersError]); no event store in the schema ([ErrNoEventStore]).
func RequestResize(ctx context.Context, pool *pgxpool.Pool, schema string, req ResizeRequest) (Resize, error) {
	if err := checkOperatorArgs(schema, req.Subscription); err != nil {
		return Resize{}, err
	}
	if req.Buckets < 1 || req.Buckets > MaxBuckets {
		return Resize{}, &kumierr.ConfigError{Field: "leasestore.ResizeRequest.Buckets", Value: req.Buckets,
			Reason: fmt.Sprintf("must be between 1 and %d", MaxBuckets)}
	}
	if req.By != "" {
		if err := eventsource.ValidateName("requester", req.By, MaxWorkerLength); err != nil {
			return Resize{}, &kumierr.ConfigError{Field: "leasestore.ResizeRequest.By", Value: req.By, Reason: fmt.Sprintf("%v; use printable characters", err)}
		}
	}
	st := renderStatements(schema)
	var out Resize
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var tables int
		if err := tx.QueryRow(ctx, st.get("resize_event_store"), schema).Scan(&tables); err != nil {
			return err
		}
		if tables < 2 {
			return ErrNoEventStore
		}
		r, err := lockSubscription(ctx, tx, st, req.Subscription)
		if err != nil {
			return err
		}
		switch {
		case r.state != ResizeSteady:
			return &ResizeInProgressError{Subscription: req.Subscription, From: r.buckets, To: r.next, State: r.state,
				RequestedAt: orZero(r.requestedAt), RequestedBy: r.requestedBy}
		case r.generation >= eventsource.MaxGeneration:
			return &kumierr.ConfigError{Field: "leasestore.ResizeRequest.Buckets", Value: req.Buckets, Reason: fmt.Sprintf(
				"cannot change: subscription %q was resized %d times, the most a subscription can be; make a new subscription",
				req.Subscription, eventsource.MaxGeneration)}
		case r.buckets == req.Buckets:
			return fmt.Errorf("%w: %q has %d", ErrSameBuckets, req.Subscription, r.buckets)
		}
		var valid *bool
		err = tx.QueryRow(ctx, st.get("resize_index_valid"), schema, indexName(req.Buckets)).Scan(&valid)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if valid == nil || !*valid {
			return indexMissing(req.Buckets, valid != nil)
		}
		rows, _ := tx.Query(ctx, st.get("resize_old_workers"), req.Subscription)
		old, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(old) > 0 && !req.EvictOldWorkers {
			return &OldWorkersError{Subscription: req.Subscription, Workers: old}
		}
		if r, err = (subscriptionRow{}).scan(tx.QueryRow(ctx, st.get("resize_request"), req.Subscription,
			req.Buckets, req.By)); err != nil {
			return err
		}
		out = r.resize(req.Subscription)
		_, err = tx.Exec(ctx, st.get("notify"), ChannelName(schema, req.Subscription), "resize:sealing:"+operatorName(req.By))
		return err
	})
	if err != nil {
		return Resize{}, resizeError("request resize", err)
	}
	return out, nil
}

// operatorName is who an operator's notification names.
func operatorName(by string) string {
	if by == "" {
		return "kumi-operator"
	}
	return by
}

// resizeError passes the typed refusals through and wraps the rest.
func resizeError(op string, err error) error {
	var cfg *kumierr.ConfigError
	var inProgress *ResizeInProgressError
	var switched *ResizeSwitchedError
	var old *OldWorkersError
	switch {
	case errors.As(err, &cfg), errors.As(err, &inProgress), errors.As(err, &switched), errors.As(err, &old):
		return err
	case errors.Is(err, ErrNoSubscription), errors.Is(err, ErrSameBuckets), errors.Is(err, ErrNoResize),
		errors.Is(err, ErrNoEventStore):
		return fmt.Errorf("leasestore: %s: %w", op, err)
	}
	return fmt.Errorf("leasestore: %s: %w%s", op, err, migrateHint(err))
}

// CancelResize cancels subscription's resize before its switch, in one
// transaction: the next generation's lease rows and checkpoints go, the
// old buckets' proposals, cut and drains are cleared (a drained bucket is
// claimed again and resumes from its checkpoint, the cut), and the state
// is steady again; the workers learn of it by notification or on their
// next pass. It returns the subscription as it is afterwards.
//
// After the switch it refuses with a *[ResizeSwitchedError] and changes
// nothing (resize back instead); with no resize, [ErrNoResize].
func CancelResize(ctx context.Context, pool *pgxpool.Pool, schema, subscription string) (Resize, error) {
	if err := checkOperatorArgs(schema, subscription); err != nil {
		return Resize{}, err
	}
	st := renderStatements(schema)
	var out Resize
	// The cancel locks every lease row of both generations, in slot order.
	// A pass may hold a row it claimed (SKIP LOCKED, in any order) while it
	// waits for a lower one, placing claims: PostgreSQL breaks such a cycle
	// by failing one side, and when it fails the cancel, which has changed
	// nothing, the cancel is tried again.
	err := onDeadlockAgain(ctx, func() error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			out, err = cancelTx(ctx, tx, st, schema, subscription)
			return err
		})
	})
	if err != nil {
		return Resize{}, resizeError("cancel resize", err)
	}
	return out, nil
}

// cancelTx is CancelResize's transaction.
func cancelTx(ctx context.Context, tx pgx.Tx, st statements, schema, subscription string) (Resize, error) {
	r, err := lockSubscription(ctx, tx, st, subscription)
	if err != nil {
		return Resize{}, err
	}
	switch r.state {
	case ResizeSteady:
		return Resize{}, fmt.Errorf("%w: %q", ErrNoResize, subscription)
	case ResizeSwitched:
		return Resize{}, &ResizeSwitchedError{Subscription: subscription, From: r.buckets, To: r.next,
			SwitchedAt: orZero(r.switchedAt)}
	}
	b := &pgx.Batch{}
	b.Queue(st.get("resize_cancel_lock"), subscription, r.generation)
	b.Queue(st.get("resize_cancel_rows"), subscription, r.generation)
	b.Queue(st.get("resize_cancel_checkpoints"), subscription, r.generation+1)
	b.Queue(st.get("resize_cancel"), subscription, r.generation).QueryRow(func(row pgx.Row) error {
		r, err = subscriptionRow{}.scan(row)
		return err
	})
	b.Queue(st.get("notify"), ChannelName(schema, subscription), "resize:steady:kumi-operator")
	if err := tx.SendBatch(ctx, b).Close(); err != nil {
		return Resize{}, err
	}
	return r.resize(subscription), nil
}

// ReadResize reads subscription's generation and resize, with each
// bucket's status while a resize runs. It writes nothing and joins
// nothing. An unknown subscription is [ErrNoSubscription].
func ReadResize(ctx context.Context, pool *pgxpool.Pool, schema, subscription string) (Resize, error) {
	var out Resize
	err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			out, err = ReadResizeTx(ctx, tx, schema, subscription)
			return err
		})
	return out, err
}

// ReadResizeTx is [ReadResize] in the caller's transaction (make it
// repeatable read to read it at the same moment as other tables).
func ReadResizeTx(ctx context.Context, tx pgx.Tx, schema, subscription string) (Resize, error) {
	if err := checkOperatorArgs(schema, subscription); err != nil {
		return Resize{}, err
	}
	st := renderStatements(schema)
	r, err := subscriptionRow{}.scan(tx.QueryRow(ctx, st.get("resize_read"), subscription))
	if errors.Is(err, pgx.ErrNoRows) {
		return Resize{}, fmt.Errorf("leasestore: read resize: %w: %q", ErrNoSubscription, subscription)
	}
	if err != nil {
		return Resize{}, resizeError("read resize", err)
	}
	out := r.resize(subscription)
	if !out.Resizing() {
		return out, nil
	}
	rows, _ := tx.Query(ctx, st.get("resize_slots"), subscription, r.generation)
	type slotRow struct {
		SlotStatus
		generation int
	}
	slots, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (slotRow, error) {
		var s slotRow
		err := row.Scan(&s.Slot, &s.Owner, &s.Epoch, &s.Proposal, &s.Drained)
		s.generation, s.Bucket = eventsource.SlotBucket(s.Slot)
		return s, err
	})
	if err != nil {
		return Resize{}, resizeError("read resize", err)
	}
	d := gcd(out.Buckets, out.NextBuckets)
	undrained := map[int]bool{}
	for _, s := range slots {
		if s.generation == r.generation {
			if !s.Drained {
				undrained[s.Bucket%d] = true
			}
			out.Old = append(out.Old, s.SlotStatus)
		}
	}
	for _, s := range slots {
		if s.generation == r.generation+1 {
			s.Proposal = -1
			s.Ready = out.State == ResizeSwitched && !undrained[s.Bucket%d]
			out.New = append(out.New, s.SlotStatus)
		}
	}
	return out, nil
}

// ResizeMade returns the [Resize.ID] of the resize that made generation
// of subscription; 0 when no resize made it (generation 0, a generation
// not made yet, or one whose resize was cancelled: a cancel deletes it). A
// resize completed iff the generation it was to make names it.
func ResizeMade(ctx context.Context, pool *pgxpool.Pool, schema, subscription string, generation int) (int64, error) {
	if err := checkOperatorArgs(schema, subscription); err != nil {
		return 0, err
	}
	var id int64
	if err := pool.QueryRow(ctx, renderStatements(schema).get("resize_made"), subscription, generation).Scan(&id); err != nil {
		return 0, resizeError("read the resize that made a generation", err)
	}
	return id, nil
}

// ProposeCut is what the reader of an old bucket calls when it learns of a
// resize in state sealing and its lease carried no bound: frozen at its
// cursor (delivering nothing beyond the events at or below it), it
// proposes a bound for slot, held at epoch. In one transaction it locks
// the subscription, checks the fence (a *[LostFenceError] when the
// holding is gone), and sets the slot's proposal to the largest of its
// previous proposal, cursor and the head of the event store read after
// the fence; the proposal that completes the set decides the cut C, the
// largest. It returns the reader's bound: the proposal, or C once decided
// (then nothing is written); Resizing false when no resize runs (it was
// cancelled). The reader delivers up to the bound and no further. The
// bound names the resize in force ([Bound.Resize]). The cut becomes the
// new buckets' checkpoints, so it is bounded by the head as every
// checkpoint write is: a cursor above the head (read on another server,
// before a failover), or a decision on an earlier such proposal, is
// refused with an *[eventsource.CheckpointAboveHeadError] and writes
// nothing; the reader restarts from its checkpoint.
func (s *Store) ProposeCut(ctx context.Context, slot int, epoch, cursor int64) (Bound, error) {
	return s.ProposeCutFor(ctx, slot, epoch, 0, cursor)
}

// ProposeCutFor is [Store.ProposeCut] for the resize whose [Resize.ID] is
// resize only (0: whichever is in force), as the runtime's readers call
// it: when that resize is no longer in force — cancelled, and perhaps
// another requested since — it writes nothing and returns a bound that
// names it with Resizing false. A proposal that outlives its resize is
// thus never counted for the next one (the freeze it was made from says
// nothing of what the reader delivered since the next one began).
func (s *Store) ProposeCutFor(ctx context.Context, slot int, epoch, resize, cursor int64) (Bound, error) {
	if s.closed.Load() {
		return Bound{}, ErrClosed
	}
	var out Bound
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		r, err := lockSubscription(ctx, tx, s.st, s.cfg.Subscription)
		if err != nil {
			return err
		}
		if err := s.guardResize(ctx, tx, slot, epoch); err != nil {
			return err
		}
		gen, _ := eventsource.SlotBucket(slot)
		switch {
		case resize != 0 && resize != r.id:
			out = Bound{Resize: resize} // that resize is over
			return nil
		case r.state == ResizeSteady || gen != r.generation:
			out = Bound{Resize: r.id}
			return nil // no resize bounds this slot
		case r.state != ResizeSealing:
			out = Bound{Resize: r.id, Resizing: true, Limit: *r.cut, Decided: true}
			return nil
		}
		var proposal *int64
		var head int64
		var missing int
		if err := tx.QueryRow(ctx, s.st.get("resize_propose"), s.cfg.Subscription, slot, cursor).Scan(&proposal, &head); err != nil {
			return err
		}
		if proposal == nil {
			return &eventsource.CheckpointAboveHeadError{Subscription: s.cfg.Subscription, Bucket: slot, Position: cursor, Head: head}
		}
		out = Bound{Resize: r.id, Resizing: true, Limit: *proposal}
		var c int64
		if err := tx.QueryRow(ctx, s.st.get("resize_proposals"), s.cfg.Subscription, r.generation).Scan(&missing, &c); err != nil {
			return err
		}
		event := "propose"
		if missing == 0 {
			var decided bool
			if err := tx.QueryRow(ctx, s.st.get("resize_decide"), s.cfg.Subscription, r.generation, c, r.next).
				Scan(&decided, &head); err != nil {
				return err
			}
			if !decided { // an earlier proposal above the head: from another server
				return &eventsource.CheckpointAboveHeadError{Subscription: s.cfg.Subscription,
					Bucket: eventsource.Slot(r.generation+1, 0), Position: c, Head: head}
			}
			out = Bound{Resize: r.id, Resizing: true, Limit: c, Decided: true}
			event = "resize:cut"
			s.log.Info("resize cut decided", "slot", slot, "epoch", epoch, "cut", c)
		} else {
			s.log.Info("resize cut proposed", "slot", slot, "epoch", epoch, "proposal", proposal, "missing", missing)
		}
		return s.notify(ctx, tx, event)
	})
	if err != nil {
		var lost *LostFenceError
		var above *eventsource.CheckpointAboveHeadError
		if errors.As(err, &lost) || errors.As(err, &above) {
			return Bound{}, err
		}
		return Bound{}, resizeError(fmt.Sprintf("propose a cut for slot %d", slot), err)
	}
	return out, nil
}

// DrainTx marks old slot drained, in the caller's transaction, once its
// reader has every event of its bucket up to the cut done (acked or
// dead-lettered, retries finished): it locks the subscription, checks the
// fence (a *[LostFenceError] when the holding is gone), requires the
// resize to be at this cut (else an error wrapping [ErrNoResize]: it was
// cancelled, and the reader goes on unbounded), writes the slot's
// checkpoint at cut (forward only: a checkpoint above the cut is an
// error; a cut above the event store's head is refused with an
// *[eventsource.CheckpointAboveHeadError], in the same statement), releases the slot for good and advances the resize — the drain
// that completes a new bucket's feeders is the switch, the last one
// completes it. The slot leaves this worker's view before the write, as
// with [Store.HandOver]; stop its reader. Commit tx at once: it holds the
// subscription's row.
func (s *Store) DrainTx(ctx context.Context, tx pgx.Tx, slot int, epoch, cut int64) error {
	return s.DrainCutTx(ctx, tx, slot, epoch, Bound{Resizing: true, Limit: cut, Decided: true})
}

// DrainCutTx is [Store.DrainTx] to the decided cut of the resize the
// bound names ([Bound.Resize]; 0: whichever is in force): a drain for a
// resize no longer in force is refused with [ErrNoResize], whatever its
// cut, even one equal to the cut of the resize in force.
func (s *Store) DrainCutTx(ctx context.Context, tx pgx.Tx, slot int, epoch int64, b Bound) error {
	if s.closed.Load() {
		return ErrClosed
	}
	r, err := lockSubscription(ctx, tx, s.st, s.cfg.Subscription)
	if err != nil {
		return resizeError("drain", err)
	}
	if err := s.guardResize(ctx, tx, slot, epoch); err != nil {
		return err
	}
	gen, _ := eventsource.SlotBucket(slot)
	cut := b.Limit
	if (r.state != ResizeCut && r.state != ResizeSwitched) || gen != r.generation || *r.cut != cut ||
		!b.Decided || (b.Resize != 0 && b.Resize != r.id) {
		return fmt.Errorf("leasestore: drain slot %d to %d for resize %d: the resize is %d, %s at generation %d: %w",
			slot, cut, b.Resize, r.id, r.state, r.generation, ErrNoResize)
	}
	s.forget(slot)
	var stored *int64
	var head int64
	if err := tx.QueryRow(ctx, s.st.get("resize_drain_checkpoint"), s.cfg.Subscription, slot, cut).Scan(&stored, &head); err != nil {
		return resizeError("drain", err)
	}
	if stored == nil {
		return &eventsource.CheckpointAboveHeadError{Subscription: s.cfg.Subscription, Bucket: slot, Position: cut, Head: head}
	}
	if *stored != cut {
		return fmt.Errorf("leasestore: drain slot %d: its checkpoint is %d, beyond the cut %d (reset during the resize?)",
			slot, *stored, cut)
	}
	if _, err := tx.Exec(ctx, s.st.get("resize_drain"), s.cfg.Subscription, slot, cut); err != nil {
		return resizeError("drain", err)
	}
	s.log.Info("resize slot drained", "slot", slot, "epoch", epoch, "cut", cut)
	state, _, err := s.advance(ctx, tx, r, false)
	if err != nil {
		return resizeError("drain", err)
	}
	return s.notify(ctx, tx, "resize:"+string(state))
}

// Drain is [Store.DrainTx] in a transaction of its own.
func (s *Store) Drain(ctx context.Context, slot int, epoch, cut int64) error {
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error { return s.DrainTx(ctx, tx, slot, epoch, cut) })
}

// advance makes the resize's transitions whose conditions hold, under the
// subscriptions row lock the caller holds (r as locked): cut → switched
// when some new bucket's feeders have all drained, and → steady at the
// next generation when every old bucket has; it returns the state after.
// The old lease rows go at completion (those locked at that moment — a
// zombie's fence — are left to later passes' prune).
func (s *Store) advance(ctx context.Context, tx txConn, r subscriptionRow, inPass bool) (ResizeState, []int32, error) {
	if r.state != ResizeCut && r.state != ResizeSwitched {
		return r.state, nil, nil
	}
	var rows, undrainedRows int
	var classes []int32
	d := gcd(r.buckets, r.next)
	if err := tx.QueryRow(ctx, s.st.get("resize_undrained"), s.cfg.Subscription, r.generation, d).
		Scan(&rows, &undrainedRows, &classes); err != nil {
		return r.state, nil, err
	}
	switch {
	case rows > 0 && undrainedRows == 0:
		if _, err := tx.Exec(ctx, s.st.get("resize_complete"), s.cfg.Subscription, r.generation, r.next); err != nil {
			return r.state, nil, err
		}
		s.log.Info("resize completed", "generation", r.generation+1, "buckets", r.next, "cut", *r.cut,
			"by_pass", inPass)
		return ResizeSteady, nil, nil
	case r.state == ResizeCut && len(classes) < d:
		if _, err := tx.Exec(ctx, s.st.get("resize_switch"), s.cfg.Subscription, r.generation); err != nil {
			return r.state, nil, err
		}
		s.log.Info("resize switched", "generation", r.generation+1, "buckets", r.next, "cut", *r.cut, "by_pass", inPass)
		return ResizeSwitched, classes, nil
	}
	return r.state, classes, nil
}
