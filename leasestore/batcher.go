package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PassBatcher sends the lease passes of many stores of one process — one
// per subscription group — in one round trip: the passes that come to it
// within its linger go together in one pgx batch on one connection of its
// pool, each pass in a transaction of its own (BEGIN, its first batch's
// statements, COMMIT), one after the other. A process that runs K groups
// then spends one round trip per heartbeat on its steady passes, not 2K.
// Set it in [Config.Batcher] of every store that is to share it; the
// actors runtime makes one per process.
//
// Only what a pass's first batch does goes in the shared round trip: the
// heartbeat, the renewal and the reads. A pass that finds it has more to
// do — claim, withdraw, place, announce, advance a resize, prune — has
// committed that much (it is a [Store.Renew]) and runs a whole pass of its
// own right after it, as without a batcher: the statements, the locks and
// the decisions of every pass are the ones a pass without a batcher runs.
// The passes are separate transactions, so that one pass's failure never
// fails another's: a pass whose statements fail in the shared round trip
// (and every pass behind it, which the server skipped) runs again on its
// own. A shared round trip is cut at half the shortest bound of the passes
// in it, and the passes it did not finish run again on their own within
// what is left of their bounds: one pass held up by a lock never keeps the
// others from renewing. A store whose last pass was abandoned passes on
// its own until one lands, and so does one whose last pass had more to
// do than its first batch, until one has not.
//
// The stores' joins ([Store.Start]) share round trips the same way: the
// joins that come within the linger go in one round trip, each a
// transaction of its own (its BEGIN, the settings, the heartbeat and its
// COMMIT, the statements of a join without a batcher), and the
// notifications of the workers that joined together in the next. A
// process starting K groups eight at a time joins in 2K/8 round trips,
// not 2K. A join the shared round trip did not carry joins on its own.
type PassBatcher struct {
	pool   *pgxpool.Pool
	linger time.Duration

	mu sync.Mutex
	// passes are the passes queued (see run), joins the joins (see join).
	passes batchQueue[*batchedPass]
	joins  batchQueue[*batchedJoin]
	// manual, set by tests, flushes only when the test calls flush.
	manual bool
}

// maxPassBatch is the most passes one round trip of a PassBatcher
// carries; more that come together go in further round trips.
const maxPassBatch = 200

// NewPassBatcher returns a batcher that sends its passes on connections of
// pool (the pool the stores pass on). A pass waits at most linger, and at
// most a tenth of its store's heartbeat, for others to join its round
// trip (at least 0; callers that start their
// stores' passes together — the actors runtime aligns its groups'
// heartbeats — need only a few milliseconds).
func NewPassBatcher(pool *pgxpool.Pool, linger time.Duration) (*PassBatcher, error) {
	if pool == nil {
		return nil, errors.New("leasestore: NewPassBatcher needs a pool")
	}
	if linger < 0 {
		return nil, fmt.Errorf("leasestore: NewPassBatcher: linger %v is negative", linger)
	}
	return &PassBatcher{pool: pool, linger: linger}, nil
}

// batchedPass is one store's pass in a batcher: queued, then sent, then
// done.
type batchedPass struct {
	// batchCall's done is closed once first or err is set; err is why
	// the pass has no first (errRunAlone: it runs on its own).
	batchCall
	// first is what the pass's first batch read, committed.
	first firstBatch
}

// batchCall is what a pass and a join queued in a batcher share: the
// store and its pid, the caller's context, and the end — done, closed
// once the call's outcome is set, err among it.
type batchCall struct {
	s    *Store
	pid  *int32
	ctx  context.Context
	done chan struct{}
	err  error
}

func (c *batchCall) call() *batchCall { return c }

// batchItem is a call a batcher queues: a *batchedPass or a *batchedJoin.
type batchItem interface {
	comparable
	call() *batchCall
}

// batchQueue is the calls of one kind queued in a batcher, and whether
// their flush is scheduled; the batcher's mu guards it.
type batchQueue[T batchItem] struct {
	items []T
	armed bool
}

// submit queues it in q and sends q at once, by send, when it is full;
// otherwise it schedules q's flush after the linger (a tenth of the
// heartbeat at most: a pass's bound is one), unless one is scheduled or
// the batcher is flushed by hand.
func submit[T batchItem](b *PassBatcher, q *batchQueue[T], it T, send func([]T)) {
	b.mu.Lock()
	defer b.mu.Unlock()
	q.items = append(q.items, it)
	switch {
	case len(q.items) >= maxPassBatch:
		qs := q.items
		q.items = nil
		go send(qs)
	case !q.armed && !b.manual:
		q.armed = true
		time.AfterFunc(min(b.linger, it.call().s.cfg.Heartbeat/10), func() { flushQueue(b, q, send) })
	}
}

// flushQueue sends every call queued in q, by send.
func flushQueue[T batchItem](b *PassBatcher, q *batchQueue[T], send func([]T)) {
	b.mu.Lock()
	qs := q.items
	q.items, q.armed = nil, false
	b.mu.Unlock()
	if len(qs) > 0 {
		send(qs)
	}
}

// await waits for it's end and reports whether it came before its
// context's. When the context ended first, a call still queued leaves
// q; one under way is waited for (its round trip is bounded), so that a
// call never commits after its caller returned.
func await[T batchItem](b *PassBatcher, q *batchQueue[T], it T) bool {
	c := it.call()
	select {
	case <-c.done:
		return true
	case <-c.ctx.Done():
	}
	b.mu.Lock()
	queued := slices.Index(q.items, it)
	if queued >= 0 {
		q.items = slices.Delete(q.items, queued, queued+1)
	}
	b.mu.Unlock()
	if queued < 0 {
		<-c.done
	}
	return false
}

// liveCalls ends the calls of qs whose context has ended, with its error,
// and returns the others, in qs's array.
func liveCalls[T batchItem](qs []T) []T {
	live := qs[:0]
	for _, it := range qs {
		c := it.call()
		if c.ctx.Err() != nil {
			c.err = c.ctx.Err()
			close(c.done)
			continue
		}
		live = append(live, it)
	}
	return live
}

// errRunAlone: the shared round trip did not carry the pass through (its
// statements, or a pass's before it, failed; the round trip was cut); the
// pass runs on its own.
var errRunAlone = errors.New("leasestore: the pass runs on its own")

// run sends s's pass's first batch in a shared round trip, committed, and
// returns what it read; errRunAlone when it was not carried through, or
// ctx's error.
func (b *PassBatcher) run(ctx context.Context, s *Store, pid *int32) (firstBatch, error) {
	p := &batchedPass{batchCall: batchCall{s: s, pid: pid, ctx: ctx, done: make(chan struct{})}}
	submit(b, &b.passes, p, b.flushPasses)
	if await(b, &b.passes, p) {
		return p.first, p.err
	}
	// A pass still queued has left the queue; one under way was waited for
	// (its round trip is bounded: see flushPasses), so that a pass never
	// commits after it returned — a store that stops while its pass is
	// batched leaves the pool after that pass, never before it, and no
	// heartbeat of its lands after its worker row is deleted — and what
	// it read is dropped: the view stays as it was, which errs towards
	// "not held".
	return firstBatch{}, ctx.Err()
}

// flush sends every pass queued.
func (b *PassBatcher) flush() { flushQueue(b, &b.passes, b.flushPasses) }

// flushPasses runs qs's first batches, each in a transaction of its own,
// in one round trip, and tells each pass its end.
func (b *PassBatcher) flushPasses(qs []*batchedPass) {
	qs = liveCalls(qs)
	if len(qs) == 0 {
		return
	}
	// The round trip's bound: half the shortest bound left to a pass in
	// it, so that the passes it does not carry through have time to run
	// on their own.
	now := time.Now()
	bound := time.Duration(-1)
	for _, p := range qs {
		if d, ok := p.ctx.Deadline(); ok && (bound < 0 || d.Sub(now) < bound) {
			bound = d.Sub(now)
		}
	}
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	if bound >= 0 {
		ctx, cancel = context.WithTimeout(ctx, bound/2)
	}
	defer cancel()
	done := 0
	defer func() {
		for _, p := range qs[done:] {
			p.err = errRunAlone
		}
		for _, p := range qs {
			close(p.done)
		}
	}()
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer c.Release()
	conn := c.Conn()
	defer func() {
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			// A pass failed inside its transaction, or the round trip was
			// cut: end it, so that the connection goes back to the pool
			// idle.
			rctx, rcancel := context.WithTimeout(context.Background(), rollbackTimeout)
			defer rcancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()
	batch := &pgx.Batch{}
	for _, p := range qs {
		p.s.queueFirst(batch, p.pid)
		batch.Queue("COMMIT")
	}
	br := conn.SendBatch(ctx, batch)
	for _, p := range qs {
		f, err := p.s.readFirst(br) // (closes br on an error)
		if err != nil {
			return
		}
		tag, err := br.Exec()
		if err != nil {
			_ = br.Close()
			return
		}
		if tag.String() != "COMMIT" {
			_ = br.Close()
			return
		}
		p.first = f
		done++
	}
	_ = br.Close()
}

// errNotSteady: a pass's first batch was not the whole pass (see
// steadyTx).
var errNotSteady = errors.New("leasestore: the pass has more to do than its first batch")

// steadyTx is the txConn a pass's rest runs on to learn whether its first
// batch was the whole pass: every statement fails with errNotSteady, and
// no statement reaches the database.
type steadyTx struct{}

func (steadyTx) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNotSteady
}

func (steadyTx) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return steadyRows{}, errNotSteady
}

func (steadyTx) QueryRow(context.Context, string, ...any) pgx.Row { return steadyRows{} }

func (steadyTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults { return steadyBatch{} }

// steadyRows are the rows of a statement steadyTx refused.
type steadyRows struct{}

func (steadyRows) Close()                                       {}
func (steadyRows) Err() error                                   { return errNotSteady }
func (steadyRows) CommandTag() pgconn.CommandTag                { return pgconn.CommandTag{} }
func (steadyRows) FieldDescriptions() []pgconn.FieldDescription { return nil }
func (steadyRows) Next() bool                                   { return false }
func (steadyRows) Scan(...any) error                            { return errNotSteady }
func (steadyRows) Values() ([]any, error)                       { return nil, errNotSteady }
func (steadyRows) RawValues() [][]byte                          { return nil }
func (steadyRows) Conn() *pgx.Conn                              { return nil }
func (steadyRows) TypeMap() *pgtype.Map                         { return nil }

// steadyBatch is the results of a batch steadyTx refused.
type steadyBatch struct{}

func (steadyBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, errNotSteady }
func (steadyBatch) Query() (pgx.Rows, error)         { return steadyRows{}, errNotSteady }
func (steadyBatch) QueryRow() pgx.Row                { return steadyRows{} }
func (steadyBatch) Close() error                     { return errNotSteady }
func (steadyBatch) Tx() pgx.Tx                       { return nil }

// passBatched runs a pass through the batcher: its first batch in a shared
// round trip, committed, and, if that was not the whole pass, a whole pass
// of its own right after it, which announces the events the first one
// found (a join, recovered claims) with its own. ok is false when the
// batcher did not carry the pass (errRunAlone): the caller runs it on its
// own. s.opMu is held.
func (s *Store) passBatched(ctx context.Context, acquire bool, pid *int32) (out passOutcome, ok bool, err error) {
	f, err := s.cfg.Batcher.run(ctx, s, pid)
	if errors.Is(err, errRunAlone) {
		return passOutcome{}, false, nil
	}
	if err != nil {
		return passOutcome{}, true, err
	}
	out, err = s.passRest(ctx, steadyTx{}, acquire, f)
	if err == nil {
		return out, true, nil
	}
	if !errors.Is(err, errNotSteady) {
		return passOutcome{}, true, err
	}
	err = s.runPipelined(ctx, func(conn *commitTail) error {
		var err error
		out, err = s.passTx(ctx, conn, acquire, pid, f.events)
		return err
	})
	return out, true, err
}

// batchedJoin is one store's join in a batcher: queued, then sent, then
// done.
type batchedJoin struct {
	batchCall // its done is closed once hb and v, or err, are set
	hb        heartbeat
	v         subscriptionView
	// notified: the join's notification went out (when hb.joined).
	notified bool
}

// join runs s's join — BEGIN, the settings, the heartbeat, COMMIT — in a
// round trip shared with the joins of the other stores that come within
// the linger, each a transaction of its own, as passes are (a process
// that starts K groups joins K times at once); the notifications of the
// stores that joined go in one more round trip, together. It returns what
// the heartbeat read, whether the notification went out (if it did not,
// the store sends its own), errRunAlone when the shared round trip did
// not carry the join (the store joins on its own), or ctx's error.
func (b *PassBatcher) join(ctx context.Context, s *Store, pid *int32) (heartbeat, subscriptionView, bool, error) {
	j := &batchedJoin{batchCall: batchCall{s: s, pid: pid, ctx: ctx, done: make(chan struct{})}}
	submit(b, &b.joins, j, b.flushJoins)
	if await(b, &b.joins, j) {
		return j.hb, j.v, j.notified, j.err
	}
	// As a pass: a join still queued has left the queue; one under way
	// was waited for, so that it never commits after Start returned.
	return heartbeat{}, subscriptionView{}, false, ctx.Err()
}

// flushJoinsQueued sends every join queued.
func (b *PassBatcher) flushJoinsQueued() { flushQueue(b, &b.joins, b.flushJoins) }

// flushJoins runs qs's joins, each in a transaction of its own, in one
// round trip, then the notifications of those that joined in another, and
// tells each join its end. The round trips are bounded as a pass's shared
// round trip is, and at most by the shortest heartbeat among them (a
// join's own context may have no deadline): a join they did not carry
// runs on its own.
func (b *PassBatcher) flushJoins(qs []*batchedJoin) {
	qs = liveCalls(qs)
	if len(qs) == 0 {
		return
	}
	now := time.Now()
	bound := time.Duration(-1)
	for _, j := range qs {
		if bound < 0 || j.s.cfg.Heartbeat < bound {
			bound = j.s.cfg.Heartbeat
		}
		if d, ok := j.ctx.Deadline(); ok && d.Sub(now)/2 < bound {
			bound = d.Sub(now) / 2
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	done := 0
	defer func() {
		for _, j := range qs[done:] {
			j.err = errRunAlone
		}
		for _, j := range qs {
			close(j.done)
		}
	}()
	c, err := b.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer c.Release()
	conn := c.Conn()
	defer func() {
		if !conn.IsClosed() && conn.PgConn().TxStatus() != 'I' {
			rctx, rcancel := context.WithTimeout(context.Background(), rollbackTimeout)
			defer rcancel()
			_, _ = conn.Exec(rctx, "ROLLBACK")
		}
	}()
	batch := &pgx.Batch{}
	for _, j := range qs {
		j.s.queueJoin(batch, j.pid)
		batch.Queue("COMMIT")
	}
	br := conn.SendBatch(ctx, batch)
	for _, j := range qs {
		hb, v, err := j.s.readJoin(br) // (closes br on an error)
		if err != nil {
			return
		}
		tag, err := br.Exec()
		if err != nil || tag.String() != "COMMIT" {
			_ = br.Close()
			return
		}
		j.hb, j.v = hb, v
		done++
	}
	if err := br.Close(); err != nil {
		return
	}
	// Every join landed: the notifications of those that joined, in one
	// round trip (a failed one leaves each store to send its own).
	notes := &pgx.Batch{}
	for _, j := range qs {
		if j.hb.joined {
			notes.Queue(j.s.st.get("notify"), j.s.channel, "join:"+j.s.cfg.Worker)
		}
	}
	if notes.Len() == 0 || conn.SendBatch(ctx, notes).Close() != nil {
		return
	}
	for _, j := range qs {
		j.notified = j.hb.joined
	}
}
