package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
)

// PassResult is what one [Store.Pass] found and did.
type PassResult struct {
	// Owned is every bucket held after the pass, sorted by bucket,
	// including those in HandOff.
	Owned []Lease
	// Claimed is the buckets newly acquired by this pass (a subset of
	// Owned): start a reader for each, fenced at its Epoch. A bucket whose
	// epoch changed while held is in Lost and in Claimed.
	Claimed []Lease
	// Lost is the buckets held before the pass and no longer held: stop
	// their readers at once; their fenced writes will fail.
	Lost []int
	// HandOff is the held buckets another worker has claimed. Their leases
	// are no longer extended: stop the reader, flush its checkpoint, then
	// call [Store.HandOver].
	HandOff []int
	// Pending is the buckets this worker has claimed from others and waits
	// for (it activates them on a later pass, once handed over).
	Pending []int
	// Takeovers details the Claimed buckets that had an owner, or this
	// worker's claim, before: how each came to this worker, for tracing.
	Takeovers []Takeover
	// Requested is the two-phase claims this pass placed (also in Pending).
	Requested []Request
	// Live is the number of live workers, this one included.
	Live int
	// FairShare is ceil(N / Live) for the serving generation (its
	// undrained buckets during a resize).
	FairShare int
	// Ready is the held buckets of the next generation that became ready
	// in this pass (their feeders drained): start their readers now. A
	// bucket claimed ready is in Claimed, not here.
	Ready []Lease
	// Resize is the subscription's generation and resize as this pass read
	// them (Old and New are nil).
	Resize Resize
}

// Pass runs one reconcile pass, in one transaction bounded by Heartbeat (a
// hung pass is abandoned, and counts as a failed renewal; after an
// abandoned pass the next one's bound doubles, up to TTL − Margin, so that
// a database or host slower than the heartbeat still lets passes land):
// it heartbeats the
// worker row, renews and reconfirms the held buckets, activates this
// worker's claims whose owner handed over, claims free or expired buckets
// (or those of owners proven dead) up to the fair share, withdraws claims
// above it, and places two-phase claims on live owners' surplus when still
// below it. Call it every Heartbeat, and when [Store.Changes] fires.
//
// On an error nothing is changed and the previous view is kept, so
// EnsureHeld keeps judging by the last renewal that succeeded.
func (s *Store) Pass(ctx context.Context) (PassResult, error) { return s.pass(ctx, true) }

// Renew runs a pass that only heartbeats and renews: it claims, withdraws
// and places nothing (Claimed is then always empty).
func (s *Store) Renew(ctx context.Context) (PassResult, error) { return s.pass(ctx, false) }

// How a bucket came to this worker from another, in [Takeover.Evidence].
const (
	EvidenceHandoff     = "handoff"       // its owner handed it over to this worker's claim
	EvidenceExpired     = "lease_expired" // its owner's lease had expired
	EvidenceSessionGone = "session_gone"  // its owner's session was proven gone (KindSession)
)

// Takeover is a bucket this pass took that another worker owned, or that
// was handed over to this worker's claim.
type Takeover struct {
	Bucket   int    // the bucket taken
	Epoch    int64  // the epoch granted to this worker
	From     string // the previous owner; "" for a completed handoff
	Evidence string // EvidenceHandoff, EvidenceExpired or EvidenceSessionGone
}

// Request is a two-phase claim placed on another worker's bucket.
type Request struct {
	Bucket int    // the bucket claimed
	Owner  string // its owner, who is to hand it over
}

type ownedRow struct {
	bucket   int // the slot
	epoch    int64
	expires  time.Time
	pending  bool   // renewed row with a fresh claim against it: handoff
	buckets  int    // its generation's bucket count
	proposal *int64 // its cut proposal, as locked
}

type claimedRow struct {
	ownedRow
	prevOwner   string
	wasMine     bool
	prevExpired bool
}

type passOutcome struct {
	dbNow   time.Time
	renewed []ownedRow
	claimed []claimedRow
	pending []int
	placed  []Request
	live    int
	share   int
	sub     subscriptionView
	// busy: the pass ran statements after its first batch (see
	// Store.steady).
	busy bool
}

// subscriptionView is the subscription as a pass read it (no lock).
type subscriptionView struct {
	generation, buckets, next int
	state                     ResizeState
	id                        int64          // the resize in force, or the last one
	cut                       int64          // -1: not decided
	active                    int            // the serving generation's undrained buckets
	undrained                 map[int32]bool // feeder classes with an undrained old bucket (cut decided)
	retiredLeft               bool           // lease rows of retired generations remain
	completed                 bool           // this pass completed the resize: generation is the new one
}

func (v subscriptionView) resizing() bool { return v.state != ResizeSteady }

// info is what a pass tells of a held slot: its generation, bound and
// readiness.
func (v subscriptionView) info(slot, buckets int, proposal *int64) slotInfo {
	gen, bucket := eventsource.SlotBucket(slot)
	in := slotInfo{generation: gen, buckets: buckets, ready: true}
	switch {
	case gen < v.generation:
		in.ready = false // retired (only when the pass completed the resize as it ran)
	case gen == v.generation && !v.completed:
		in.bound.Resize = v.id
		if proposal != nil {
			in.bound = Bound{Resize: v.id, Resizing: true, Limit: *proposal}
		}
		if v.resizing() && v.cut >= 0 {
			in.bound = Bound{Resize: v.id, Resizing: true, Limit: v.cut, Decided: true}
		}
	case gen > v.generation:
		in.ready = v.state == ResizeSwitched && !v.undrained[int32(bucket%gcd(v.buckets, v.next))]
	}
	return in
}

// resize is the view as a Resize (without its slots).
func (v subscriptionView) resize(subscription string) Resize {
	r := Resize{Subscription: subscription, ID: v.id, Generation: v.generation, Buckets: v.buckets, State: v.state}
	if v.resizing() {
		r.NextBuckets = v.next
	}
	if v.resizing() && v.cut >= 0 {
		r.Cut, r.CutDecided = v.cut, true
	}
	return r
}

// slotInfo is what a pass knows of a held slot beyond its lease.
type slotInfo struct {
	generation, buckets int
	bound               Bound
	ready               bool
}

// lease is h, held at slot, as a Lease.
func (h heldLease) lease(slot int) Lease {
	_, bucket := eventsource.SlotBucket(slot)
	return Lease{Bucket: bucket, Slot: slot, Epoch: h.epoch, Expires: h.expires, Generation: h.slot.generation,
		Buckets: h.slot.buckets, Bound: h.slot.bound, Ready: h.slot.ready}
}

func (s *Store) pass(ctx context.Context, acquire bool) (PassResult, error) {
	if err := s.running(); err != nil {
		return PassResult{}, err
	}
	s.opMu.Lock()
	defer s.opMu.Unlock()
	parent := ctx
	bound := s.passBound()
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	start := readClock(s.cfg.clock)
	if !s.ensured {
		if err := s.ensureBuckets(ctx); err != nil {
			return PassResult{}, err
		}
	}
	var pid *int32
	var gen uint64
	if s.session != nil {
		p, g, err := s.session.ensure(ctx)
		if err != nil {
			if ctx.Err() != nil && parent.Err() == nil {
				// The session did not answer within the bound: its check
				// goes on (see session.check), and the pass is abandoned.
				err = s.abandon(bound, err)
			}
			s.log.Warn("lease session unavailable", "err", err)
			return PassResult{}, fmt.Errorf("leasestore: pass: %w", err)
		}
		pid, gen = &p, g
	}
	var out passOutcome
	batched, err := false, error(nil)
	if s.cfg.Batcher != nil && s.abandoned == 0 && s.steady {
		// A store whose last pass was abandoned passes on its own until
		// one lands: a pass held up in a shared round trip holds up the
		// passes behind it. So does one whose last pass had more to do
		// than its first batch (claims, handoffs, a resize come in
		// streaks): its next one likely has too, and would only add the
		// shared round trip's transaction to its own.
		out, batched, err = s.passBatched(ctx, acquire, pid)
	}
	if !batched {
		err = s.runPipelined(ctx, func(conn *commitTail) error {
			var err error
			out, err = s.passTx(ctx, conn, acquire, pid, nil)
			return err
		})
	}
	if err != nil {
		// Its next pass runs on its own: in a shared round trip a pass
		// that fails again sends every pass behind it to a pass of its
		// own.
		s.steady = false
		if ctx.Err() != nil && parent.Err() == nil {
			err = s.abandon(bound, err)
		}
		s.log.Warn("lease pass failed", "err", err)
		return PassResult{}, fmt.Errorf("leasestore: pass: %w", err)
	}
	s.abandoned, s.steady = 0, !out.busy
	return s.apply(start, gen, out), nil
}

// passBound is how long the next pass may run before it is abandoned: one
// heartbeat, doubled for every pass abandoned in a row before it, and at
// most TTL − Margin (never less than the heartbeat: the configuration
// guarantees Heartbeat + Margin < TTL). s.opMu is held.
//
// A pass bounded by the heartbeat alone never lands while every pass takes
// longer than that (a loaded host, a slow database): the worker would
// renew and claim nothing until the load passed, and each abandoned pass
// would also cost its connection where pgx closes one to cancel a
// statement (its default; runPipelined rolls back on a context of its
// own, so a pool that cancels instead keeps it). A
// longer bound is as safe: EnsureHeld counts from the start of the last
// renewal that landed, however late it landed, and a row lock a pass holds
// is bounded by idle_in_transaction_session_timeout = TTL.
func (s *Store) passBound() time.Duration {
	limit := s.cfg.TTL - s.cfg.Margin
	bound := s.cfg.Heartbeat
	for range s.abandoned {
		if bound >= limit {
			break
		}
		bound *= 2
	}
	return max(min(bound, limit), s.cfg.Heartbeat)
}

// abandon counts a pass abandoned at its bound and says so in its error.
// s.opMu is held.
func (s *Store) abandon(bound time.Duration, err error) error {
	first := s.abandoned == 0
	if s.passBound() < s.cfg.TTL-s.cfg.Margin {
		s.abandoned++
	}
	if first {
		return fmt.Errorf("abandoned after one heartbeat (%v): %w", bound, err)
	}
	return fmt.Errorf("abandoned after %v (the bound doubles after each abandoned pass, up to TTL − Margin = %v): %w",
		bound, s.cfg.TTL-s.cfg.Margin, err)
}

// passTx is the pass's transaction on conn: its first batch begins it
// (runPipelined commits it). A steady pass of a balanced worker is that
// batch alone. carry is events an earlier transaction of the same pass
// found and did not announce (see passBatched).
func (s *Store) passTx(ctx context.Context, conn *commitTail, acquire bool, pid *int32, carry []string) (passOutcome, error) {
	b := &pgx.Batch{}
	s.queueFirst(b, pid)
	br := conn.SendBatch(ctx, b)
	first, err := s.readFirst(br)
	if err != nil {
		return passOutcome{}, err
	}
	if err := br.Close(); err != nil {
		return passOutcome{}, err
	}
	first.events = append(carry, first.events...)
	rest := &countingTx{txConn: conn}
	out, err := s.passRest(ctx, rest, acquire, first)
	out.busy = rest.n > 0
	return out, err
}

// countingTx counts the statements and batches run on it.
type countingTx struct {
	txConn
	n int
}

func (c *countingTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	c.n++
	return c.txConn.Exec(ctx, sql, args...)
}

func (c *countingTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	c.n++
	return c.txConn.Query(ctx, sql, args...)
}

func (c *countingTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	c.n++
	return c.txConn.QueryRow(ctx, sql, args...)
}

func (c *countingTx) queueNote(sql, channel, payload string) bool {
	q, ok := c.txConn.(noteQueuer)
	if !ok || !q.queueNote(sql, channel, payload) {
		return false
	}
	c.n++
	return true
}

func (c *countingTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	c.n++
	return c.txConn.SendBatch(ctx, b)
}

// firstBatch is what a pass's first batch read: the heartbeat and the
// subscription, the other workers, the renewed rows and this worker's
// claims, and the events to announce so far.
type firstBatch struct {
	out     passOutcome // sub, renewed and dbNow set
	workers []passWorker
	mine    []int32
	events  []string
	// room is, by generation, what the claim and the placement could
	// find there as the first batch read it (see my_claims).
	room map[int]room
}

// room is what a pass's claim and placement could find in a generation,
// read without a lock: claimable is at least the rows the claim may take,
// top the highest load among the other workers owning a bucket a claim may
// be placed on (0: none).
type room struct{ claimable, top int }

// passWorker is another worker as workers_view read it.
type passWorker struct {
	worker, kind         string
	key                  int64
	live, gone, longGone bool
}

// queueFirst queues a pass's first batch on b: begin, bound this
// transaction's row locks and speak protocol 2, heartbeat and read the
// subscription, read the workers, renew, read this worker's claims. One
// round trip.
func (s *Store) queueFirst(b *pgx.Batch, pid *int32) {
	sub, me := s.cfg.Subscription, s.cfg.Worker
	b.Queue(beginSQL)
	b.Queue(s.st.get("pass_begin"), s.boundLocksArg())
	b.Queue(s.st.get("worker_heartbeat"), s.workerArgs(pid)...)
	b.Queue(s.st.get("workers_view"), sub, me, 10*s.cfg.TTL)
	b.Queue(s.st.get("renew"), sub, me, s.cfg.TTL, 2*s.cfg.TTL)
	b.Queue(s.st.get("my_claims"), sub, me)
}

// readFirst reads the results of the statements queueFirst queued, from
// br. It leaves br open for what was queued after them (the batch's
// COMMIT, or other stores' passes: see PassBatcher) and closes it only on
// an error.
func (s *Store) readFirst(br pgx.BatchResults) (firstBatch, error) {
	var f firstBatch
	fail := func(what string, err error) (firstBatch, error) {
		_ = br.Close()
		return f, fmt.Errorf("%s: %w%s", what, err, migrateHint(err))
	}
	if _, err := br.Exec(); err != nil {
		return fail("begin", err)
	}
	if _, err := br.Exec(); err != nil {
		return fail("bound locks", err)
	}
	out := &f.out
	hb, err := scanHeartbeat(br.QueryRow(), &out.sub)
	if err != nil {
		return fail("heartbeat", err)
	}
	if hb.joined {
		f.events = append(f.events, "join")
	}
	rows, _ := br.Query()
	f.workers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (passWorker, error) {
		var m passWorker
		err := r.Scan(&m.worker, &m.kind, &m.key, &m.live, &m.gone, &m.longGone)
		return m, err
	})
	if err != nil {
		return fail("members", err)
	}
	if !hb.found {
		return fail("subscription", fmt.Errorf("%w: %q (was EnsureBuckets run?)", ErrNoSubscription, s.cfg.Subscription))
	}
	rows, _ = br.Query()
	recovered := false
	out.renewed, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ownedRow, error) {
		var o ownedRow
		var rec bool
		err := r.Scan(&o.bucket, &o.epoch, &o.expires, &o.pending, &rec, &out.dbNow, &o.buckets, &o.proposal)
		recovered = recovered || rec
		return o, err
	})
	if err != nil {
		return fail("renew", err)
	}
	rows, _ = br.Query()
	f.room = map[int]room{}
	_, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (struct{}, error) {
		var gen int
		var mine []int32
		var rm room
		err := r.Scan(&gen, &mine, &rm.claimable, &rm.top)
		f.mine = append(f.mine, mine...)
		f.room[gen] = rm
		return struct{}{}, err
	})
	if err != nil {
		return fail("claims", err)
	}
	slices.Sort(f.mine)
	if recovered {
		f.events = append(f.events, "recover")
	}
	return f, nil
}

// passRest is the rest of a pass's transaction on tx, after its first
// batch f: claims, withdrawals, placements, the resize's safety net,
// pruning and the notification. A steady pass of a balanced worker runs
// no statement here.
func (s *Store) passRest(ctx context.Context, tx txConn, acquire bool, f firstBatch) (passOutcome, error) {
	sub, me := s.cfg.Subscription, s.cfg.Worker
	claimStale := 2 * s.cfg.TTL
	out, workers, mine, events := f.out, f.workers, f.mine, f.events
	v := &out.sub

	live := map[string]bool{}
	var deadWorkers []string
	var deadKeys []int64
	prune := false
	for _, m := range workers {
		if m.live && !m.gone {
			live[m.worker] = true
		}
		if m.gone {
			deadWorkers, deadKeys = append(deadWorkers, m.worker), append(deadKeys, m.key)
		}
		prune = prune || m.longGone
	}
	out.live = len(live) + 1
	pending := make([]int, len(mine))
	for i, b := range mine {
		pending[i] = int(b)
	}
	// Each active generation is balanced on its own (docs/design/resize.md, §9):
	// the serving one's undrained buckets, and the next one's during a
	// resize.
	type generation struct{ gen, n, active int }
	gens := []generation{{v.generation, v.buckets, v.active}}
	if v.resizing() {
		gens = append(gens, generation{v.generation + 1, v.next, v.next})
	}
	var dead []string
	confirmed := false
	for i, g := range gens {
		share := FairShare(g.active, out.live)
		if i == 0 {
			out.share = share
		}
		if !acquire {
			continue
		}
		inGen := func(slot int) bool { gen, _ := eventsource.SlotBucket(slot); return gen == g.gen }
		held := 0
		for _, r := range out.renewed {
			if !r.pending && inGen(r.bucket) {
				held++
			}
		}
		// Outside a resize, with no worker's session gone, a claim the
		// first batch found no claimable row for, and a placement it
		// found no owner to place on, are skipped: they would find
		// nothing (a row that turned claimable since is the next pass's,
		// as if this pass had run a moment earlier). So a worker held at
		// the floor below the share (N not a multiple of the workers)
		// passes as a balanced one does, in its first batch alone, not in
		// a transaction of its own with a claim, a placement and a COMMIT
		// every heartbeat.
		rm, known := f.room[g.gen]
		quiet := known && !v.resizing() && len(deadWorkers) == 0
		if want := share - held; want > 0 && g.active > 0 && !(quiet && rm.claimable == 0) {
			if !confirmed && len(deadWorkers) > 0 {
				if err := tx.QueryRow(ctx, s.st.get("confirm_dead"), sub, deadWorkers, deadKeys).Scan(&dead); err != nil {
					return out, fmt.Errorf("confirm dead sessions: %w", err)
				}
				if len(dead) > 0 {
					events = append(events, "dead")
					s.log.Info("lease workers' sessions are gone", "dead", dead)
				}
			}
			confirmed = true
			if dead == nil {
				dead = []string{}
			}
			rows, _ := tx.Query(ctx, s.st.get("claim"), sub, me, want, dead, s.offset, claimStale, g.n, s.cfg.TTL, g.gen)
			claimed, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (claimedRow, error) {
				var c claimedRow
				err := r.Scan(&c.bucket, &c.epoch, &c.expires, &c.prevOwner, &c.wasMine, &c.prevExpired, &out.dbNow,
					&c.buckets, &c.proposal)
				return c, err
			})
			if err != nil {
				return out, fmt.Errorf("claim: %w", err)
			}
			if len(claimed) > 0 {
				events = append(events, "claim")
			}
			for _, c := range claimed {
				held++
				pending = slices.DeleteFunc(pending, func(b int) bool { return b == c.bucket })
			}
			out.claimed = append(out.claimed, claimed...)
		}
		mineInGen := 0
		for _, p := range pending {
			if inGen(p) {
				mineInGen++
			}
		}
		switch have := held + mineInGen; {
		case have > share:
			rows, _ := tx.Query(ctx, s.st.get("withdraw_claims"), sub, me, have-share, g.gen)
			gone, err := pgx.CollectRows(rows, pgx.RowTo[int32])
			if err != nil {
				return out, fmt.Errorf("withdraw claims: %w", err)
			}
			for _, w := range gone {
				pending = slices.DeleteFunc(pending, func(b int) bool { return b == int(w) })
			}
			if len(gone) > 0 {
				events = append(events, "withdraw")
			}
		case have < share && len(live) > 0 && !(quiet && have >= g.active/out.live && rm.top <= share):
			// (At the floor, place takes only from an owner above the
			// share: none, when the first batch found no load above it.)
			placed, err := s.place(ctx, tx, g.gen, have, share, g.active/out.live, live)
			if err != nil {
				return out, fmt.Errorf("place claims: %w", err)
			}
			for _, p := range placed {
				pending = append(pending, p.Bucket)
			}
			if len(placed) > 0 {
				out.placed = append(out.placed, placed...)
				events = append(events, "request")
			}
		}
	}
	if !v.resizing() && carryProposal(v.generation, out.renewed, out.claimed) {
		// A resize began after the heartbeat read the subscription: a row
		// of the serving generation carries a proposal as locked. Read the
		// subscription again, so that the pass reports no steady state
		// beside a lease bounded by its row (the bound rule).
		if err := s.reread(ctx, tx, v); err != nil {
			return out, fmt.Errorf("resize: %w", err)
		}
	}
	if v.resizing() {
		// The safety net of the resize's transitions (docs/design/resize.md §5):
		// never waiting for the subscriptions row, which a transition
		// elsewhere may hold while it waits for a lease row this pass holds.
		r, err := subscriptionRow{}.scan(tx.QueryRow(ctx, s.st.get("resize_lock_skip"), sub))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return out, fmt.Errorf("resize: %w", err)
		default:
			state, classes, err := s.advance(ctx, tx, r, true)
			if err != nil {
				return out, fmt.Errorf("resize: %w", err)
			}
			if state != r.state {
				if err := s.notify(ctx, tx, "resize:"+string(state)); err != nil {
					return out, err
				}
				if state == ResizeSteady {
					v.completed = true
					v.generation, v.buckets, v.next, v.cut, v.active = r.generation+1, r.next, 0, -1, r.next
				} else {
					v.undrained = classSet(classes)
				}
				v.state = state
			}
		}
	}
	if v.retiredLeft && !v.resizing() {
		if _, err := tx.Exec(ctx, s.st.get("prune_retired"), sub, v.generation); err != nil {
			return out, fmt.Errorf("prune retired buckets: %w", err)
		}
	}
	if prune {
		if _, err := tx.Exec(ctx, s.st.get("prune_workers"), sub, me, 10*s.cfg.TTL); err != nil {
			return out, fmt.Errorf("prune workers: %w", err)
		}
	}
	if len(events) > 0 {
		if err := s.notify(ctx, tx, strings.Join(events, ",")); err != nil {
			return out, err
		}
	}
	sort.Ints(pending)
	out.pending = pending
	return out, nil
}

// carryProposal reports whether a row of generation gen, among those a
// pass renewed or claimed, carries a cut proposal as locked.
func carryProposal(gen int, renewed []ownedRow, claimed []claimedRow) bool {
	carries := func(r ownedRow) bool {
		g, _ := eventsource.SlotBucket(r.bucket)
		return g == gen && r.proposal != nil
	}
	return slices.ContainsFunc(renewed, carries) ||
		slices.ContainsFunc(claimed, func(c claimedRow) bool { return carries(c.ownedRow) })
}

// reread reads the subscription into v again, later than the heartbeat
// read it: its state, next bucket count and cut, and once the cut is
// decided, the serving generation's undrained buckets and feeder classes.
// The generation cannot have moved on meanwhile: the pass holds a row of
// it that carries a proposal, so undrained.
func (s *Store) reread(ctx context.Context, tx txConn, v *subscriptionView) error {
	r, err := subscriptionRow{}.scan(tx.QueryRow(ctx, s.st.get("resize_read"), s.cfg.Subscription))
	if err != nil {
		return err
	}
	v.state, v.next, v.cut, v.id = r.state, r.next, -1, r.id
	if r.cut != nil {
		v.cut = *r.cut
		var rows int
		var classes []int32
		if err := tx.QueryRow(ctx, s.st.get("resize_undrained"), s.cfg.Subscription, v.generation,
			gcd(v.buckets, v.next)).Scan(&rows, &v.active, &classes); err != nil {
			return err
		}
		v.undrained = classSet(classes)
	}
	return nil
}

// heartbeat is what the heartbeat statement reports besides the
// subscription.
type heartbeat struct {
	joined bool // the worker was absent or expired before it
	found  bool // the subscription has its row
}

// scanHeartbeat scans worker_heartbeat's row: the heartbeat, and the
// subscription into v.
func scanHeartbeat(row pgx.Row, v *subscriptionView) (heartbeat, error) {
	var hb heartbeat
	var state string
	var classes []int32
	err := row.Scan(&hb.joined, &hb.found, &v.generation, &v.buckets, &state, &v.next, &v.cut, &v.active, &classes,
		&v.retiredLeft, &v.id)
	v.state = ResizeState(state)
	v.undrained = classSet(classes)
	return hb, err
}

// classSet is a set of feeder classes.
func classSet(classes []int32) map[int32]bool {
	out := make(map[int32]bool, len(classes))
	for _, c := range classes {
		out[c] = true
	}
	return out
}

// apply makes a committed pass the new view and reports the differences.
func (s *Store) apply(start reading, gen uint64, out passOutcome) PassResult {
	res := PassResult{Live: out.live, FairShare: out.share, Pending: out.pending, Requested: out.placed,
		Resize: out.sub.resize(s.cfg.Subscription)}
	if res.Pending == nil {
		res.Pending = []int{}
	}
	s.viewMu.Lock()
	prev := s.view
	next := make(map[int]heldLease, len(out.renewed)+len(out.claimed))
	for _, r := range out.renewed {
		h := heldLease{epoch: r.epoch, expires: r.expires, handoff: r.pending, renewed: start, gen: gen,
			slot: out.sub.info(r.bucket, r.buckets, r.proposal)}
		p, had := prev[r.bucket]
		same := had && p.epoch == r.epoch
		if same && p.fenced {
			// A fenced write found it gone after this pass read its row:
			// the epoch never comes back, so the mark stands.
			h.fenced = true
		}
		if r.pending {
			// Not extended this pass: judge it by what the database says is
			// left, and never fresher than the view already had it.
			h.renewed = start.add(r.expires.Sub(out.dbNow) - s.cfg.TTL)
			if same {
				h.renewed = h.renewed.older(p.renewed)
			}
			res.HandOff = append(res.HandOff, r.bucket)
		}
		next[r.bucket] = h
		switch {
		case !same:
			res.Claimed = append(res.Claimed, h.lease(r.bucket))
		case h.slot.ready && !p.slot.ready:
			res.Ready = append(res.Ready, h.lease(r.bucket))
		}
	}
	for _, c := range out.claimed {
		h := heldLease{epoch: c.epoch, expires: c.expires, renewed: start, gen: gen,
			slot: out.sub.info(c.bucket, c.buckets, c.proposal)}
		next[c.bucket] = h
		res.Claimed = append(res.Claimed, h.lease(c.bucket))
		t := Takeover{Bucket: c.bucket, Epoch: c.epoch, From: c.prevOwner}
		switch {
		case c.prevOwner == "" && c.wasMine:
			t.Evidence = EvidenceHandoff
		case c.prevOwner == "":
			continue // a free bucket: a plain claim
		case c.prevExpired:
			t.Evidence = EvidenceExpired
		default:
			t.Evidence = EvidenceSessionGone
		}
		res.Takeovers = append(res.Takeovers, t)
	}
	for b, p := range prev {
		if h, ok := next[b]; !ok || h.epoch != p.epoch {
			res.Lost = append(res.Lost, b)
		}
	}
	for b, h := range next {
		res.Owned = append(res.Owned, h.lease(b))
	}
	// Once it is the view, the map is written by others (a failed fence
	// marks its bucket) and read only under the lock.
	s.view = next
	s.serving = [2]int{out.sub.generation, out.sub.buckets}
	s.viewMu.Unlock()
	bySlot := func(l []Lease) {
		sort.Slice(l, func(i, j int) bool { return l[i].Slot < l[j].Slot })
	}
	bySlot(res.Owned)
	bySlot(res.Claimed)
	bySlot(res.Ready)
	sort.Ints(res.Lost)
	sort.Ints(res.HandOff)
	sort.Slice(res.Takeovers, func(i, j int) bool { return res.Takeovers[i].Bucket < res.Takeovers[j].Bucket })
	for _, t := range res.Takeovers {
		s.log.Info("lease taken over", "bucket", t.Bucket, "epoch", t.Epoch, "from", t.From, "evidence", t.Evidence)
	}
	if n := len(res.Claimed) - len(res.Takeovers); n > 0 {
		s.log.Debug("leases claimed", "count", n)
	}
	if len(res.Lost) > 0 {
		s.log.Info("leases lost", "buckets", res.Lost)
	}
	if len(res.HandOff) > 0 {
		s.log.Debug("leases to hand off", "buckets", res.HandOff)
	}
	return res
}
