package eventsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/startstop"
)

// SequencerOptions tune a [Sequencer]. Zero values mean defaults.
type SequencerOptions struct {
	// MinInterval is the poll interval right after work was found, and
	// also the least time between two steps, so that a busy store is
	// sequenced in batches rather than one transaction per append.
	// MaxInterval is the interval it backs off to while idle. Appends made
	// through this process's Store wake the sequencer at once (at most
	// MinInterval after its last step); appends from other processes are
	// found by polling. Defaults 5 ms and 50 ms.
	MinInterval, MaxInterval time.Duration
	// IdleInterval is the interval between looks once the sequencer has
	// seen no activity for 10 s: no local append, no
	// pending event, no move of the head (another process's sequencer
	// sequenced). It bounds what a quiet process costs the database (one
	// look per IdleInterval, not per MaxInterval) at the price of finding
	// the first append of a sequencer-less process after a quiet spell
	// within IdleInterval instead of MaxInterval; local appends still
	// wake the sequencer at once. Default 1 s; at least MaxInterval.
	IdleInterval time.Duration
	// Logger receives a failure at Warn (the first of a run of equal
	// ones; the rest at Debug), a stuck backlog at Warn every
	// 10 s, a recovery at Info and a reset of the
	// events' sequence at Error; nil discards.
	Logger *slog.Logger
}

// Timings of a [Sequencer]'s error handling.
const (
	// sequencerRetryMin and sequencerRetryMax bound the exponential
	// backoff, with jitter (uniform in [d/2, d]), after a failed step.
	// Appends do not cut a backoff short.
	sequencerRetryMin = 100 * time.Millisecond
	sequencerRetryMax = 5 * time.Second
	// sequencerReconnectMax caps that backoff while the failure is the
	// server being away (a connect refused or turned down, a connection
	// lost, a server shutting down or starting): a server that went away,
	// as in a failover, is found again, or its promoted standby, within it
	// once it accepts. A server that refuses a connection (too many
	// clients) is retried with the backoff up to sequencerRetryMax.
	sequencerReconnectMax = 500 * time.Millisecond
	// sequencerStuckAfter is how long steps fail, or the backlog waits
	// while the head does not move, before the sequencer reports itself
	// stuck: at Warn, then every sequencerReportInterval while it lasts.
	sequencerStuckAfter     = 10 * time.Second
	sequencerReportInterval = 10 * time.Second
	// sequencerBacklogCountMax bounds the count of a stuck report.
	sequencerBacklogCountMax = 1_000_000
	// sequencerIdleAfter is how long a [Sequencer] sees no activity before
	// its looks slow from MaxInterval to IdleInterval.
	sequencerIdleAfter = 10 * time.Second
	// holderCheckEvery is the least time between two looks at the holder
	// of the sequencer row while it stays held.
	holderCheckEvery = sequencerStallTimeout / 5
)

// SequencerStats is a snapshot of a [Sequencer]'s health, for metrics and
// status pages.
type SequencerStats struct {
	// Attempts counts the sequencer's tries: a look for pending events
	// or a step, failed ones included. Failures counts failed tries;
	// Failing is the number of failed tries in a row now (0 when
	// healthy), since FailingSince, the last one's error LastError.
	Attempts, Failures int64
	Failing            int
	FailingSince       time.Time
	LastError          error
	// Batch is the current step size, in appends: 5,000,
	// or less for a while after steps were cancelled by a timeout
	// (Timeouts counts them).
	Batch    int
	Timeouts int64
	// Resets counts resets of the events' sequence found and recovered
	// from (see [SequenceResetError]).
	Resets int64
	// BacklogAge is the age of the oldest unsequenced committed event,
	// as of the last look plus the time since (0 when there was none).
	// Backlog is the number of unsequenced committed events counted for
	// the last stuck report (at most 1,000,000; -1 when not counted or
	// when the count failed).
	BacklogAge time.Duration
	Backlog    int64
	// Head is the last position handed out, as of the sequencer's last
	// look (taken when it polls); LastProgress is when a look last saw it
	// move (any process's sequencer may have moved it) or a step of this
	// one last sequenced events.
	Head         int64
	LastProgress time.Time
	// Stuck reports that steps have failed, or the backlog waited with the
	// head still, for 10 s.
	Stuck bool
	// Takeovers counts the stalled holders of the sequencer row this
	// sequencer ended (see [Sequencer]: stalled for 500 ms).
	Takeovers int64
	// Stranded counts the committed appends found below the search
	// watermark without a position, which the sequencer's search never
	// reaches, and given back to it (see [Sequencer]).
	Stranded int64
}

// clock is the Sequencer's time source; tests inject a fake one.
type clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// Sequencer runs [Store.Sequence] in the background: at once after a local
// append, and by polling for other processes' appends. Run one per process
// that appends or subscribes; several across processes cooperate (one
// sequences at a time, the others skip).
//
// A sequencer whose steps have found the sequencer row held for 100 ms
// looks at the holder's session, then at most every 100 ms while that
// lasts, and ends it when it has stalled for 500 ms (idle
// in its transaction, or blocked sending to its client): a frozen or
// cut-off process holds every position of the store back for no longer
// than that. Its transaction
// rolls back, so nothing is skipped or numbered twice. This needs the
// holder's role (or pg_read_all_stats and pg_signal_backend); see
// docs/design/eventsource.md, "A stalled holder".
//
// Its looks and steps run on a connection of its own, made with the
// store's pool's settings (its BeforeConnect and AfterConnect hooks
// included), not on the pool: a pool whose every connection the process's
// appends hold (a burst, a slow server) would otherwise make the step wait
// behind them, and every live delivery of the store with it. A lost
// connection is made again at the next step. (Looking at a stalled holder
// and counting a stuck backlog, both rare, use the pool.)
//
// Every 10 s (and at its first step) it looks below
// the search watermark for committed appends without a position, which no
// step would ever reach; none should exist, but a watermark raised by a
// candidate from before a failover left some (see [Store.Sequence]). It
// lowers the watermark below the first one, so that the next step numbers
// them, logs it at Warn and counts it in Stranded.
//
// A failed step is retried after an exponential backoff with jitter
// (100 ms to 5 s, or to 500 ms while it cannot connect); a step cancelled by a timeout
// is retried at once with half the batch (see [Store.Sequence]). Its
// health is in [Sequencer.Stats]. Its Start and Stop follow kumi's
// lifecycle contract (docs/design/architecture.md, "Lifecycle").
type Sequencer struct {
	store *Store
	opts  SequencerOptions
	clk   clock

	life startstop.Lifecycle

	statsMu sync.Mutex
	stats   SequencerStats
	lookAt  time.Time // when BacklogAge was measured
	errKey  string    // the kind of the last failure logged at Warn
	report  time.Time // the last stuck report

	// conn is the connection the looks and steps run on, the sequencer's
	// own (see connection); nil until made, and after it closed.
	conn *pgx.Conn
	// connLost reports that the last step failed for want of a
	// connection: it could not make one, or lost the one it had.
	connLost bool

	rescuedAt time.Time // the last look below the watermark (see rescue)
	activeAt  time.Time // the last activity seen: a local append, a pending event, a head that moved, a step that sequenced

	heldSince time.Time // when steps began to find the row held (zero: not held)
	holderAt  time.Time // the last look at the row's holder
	holderErr string    // the kind of the last failed look logged at Warn
}

// NewSequencer returns a sequencer for store, not started.
func NewSequencer(store *Store, opts SequencerOptions) *Sequencer {
	if opts.MinInterval <= 0 {
		opts.MinInterval = 5 * time.Millisecond
	}
	if opts.MaxInterval < opts.MinInterval {
		opts.MaxInterval = 50 * time.Millisecond
		if opts.MaxInterval < opts.MinInterval {
			opts.MaxInterval = opts.MinInterval
		}
	}
	if opts.IdleInterval < opts.MaxInterval {
		opts.IdleInterval = max(time.Second, opts.MaxInterval)
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Sequencer{store: store, opts: opts, clk: realClock{},
		stats: SequencerStats{Batch: sequencerBatchDefault, Backlog: -1}}
}

// Start runs the sequencer in the background until [Sequencer.Stop]; it
// returns at once. It follows kumi's lifecycle contract
// (docs/design/architecture.md, "Lifecycle"): ctx bounds starting only, a second
// Start does nothing, and after Stop it returns [kumierr.ErrStopped].
func (q *Sequencer) Start(ctx context.Context) error {
	return q.life.Start(ctx, func(context.Context) error {
		q.life.Go(q.run)
		return nil
	})
}

// Stop stops the sequencer and waits for its step under way to end, at
// most until ctx ends (then it returns ctx.Err(), and the step ends soon
// after). It is idempotent and safe before Start.
func (q *Sequencer) Stop(ctx context.Context) error { return q.life.Stop(ctx, nil) }

// Stats returns a snapshot of the sequencer's health.
func (q *Sequencer) Stats() SequencerStats {
	q.statsMu.Lock()
	defer q.statsMu.Unlock()
	st := q.stats
	if st.BacklogAge > 0 {
		st.BacklogAge += q.clk.Now().Sub(q.lookAt)
	}
	return st
}

// sleep waits d on the sequencer's clock; false when ctx ended first.
func (q *Sequencer) sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	select {
	case <-ctx.Done():
		return false
	case <-q.clk.After(d):
		return true
	}
}

func (q *Sequencer) run(ctx context.Context) {
	defer q.closeConn()
	batch := newStepSize()
	var (
		interval time.Duration // 0: at once
		retry    bool          // waiting out a backoff, which appends do not cut short
		last     time.Time
	)
	for {
		local := false
		if retry || interval > 0 {
			var wake <-chan struct{}
			if !retry {
				wake = q.store.appended
			}
			select {
			case <-ctx.Done():
				return
			case <-q.clk.After(interval):
			case <-wake:
				local = true
			}
		}
		// At most one step per MinInterval: a busy store is sequenced in
		// batches, not one round trip per append.
		if !last.IsZero() && !q.sleep(ctx, q.opts.MinInterval-q.clk.Now().Sub(last)) {
			return
		}
		last = q.clk.Now()
		n, err := q.step(ctx, local, &batch)
		if ctx.Err() != nil {
			return
		}
		if local || n > 0 || q.activeAt.IsZero() {
			q.activeAt = q.clk.Now()
		}
		q.connLost = err != nil && (q.conn == nil || q.conn.IsClosed()) && serverGone(err)
		interval, retry = q.record(ctx, n, err, interval)
		if err == nil && q.rescue(ctx) {
			interval = 0 // the watermark was lowered: sequence at once
		}
		if err == nil && batch.held {
			if q.takeOver(ctx) {
				interval = 0 // the row is free: sequence at once
			}
		} else {
			q.heldSince = time.Time{}
		}
	}
}

// step sequences what is pending. After a local append there is work for
// sure; otherwise a cheap look first saves a transaction when idle, unless
// it shows the sequence reset (the step deals with that). A look cancelled
// by a timeout (a role's statement_timeout: it runs on the session's
// settings) does not stop the step, which sets its own.
func (q *Sequencer) step(ctx context.Context, local bool, batch *stepSize) (int, error) {
	batch.held = false
	db, err := q.connection(ctx)
	if err != nil {
		q.countAttempt()
		return 0, err
	}
	if !local {
		var head, low, lastSeq int64
		var age *float64
		err := db.QueryRow(ctx, q.store.sql.sequencerPending, q.store.q+".appends").Scan(&head, &age, &low, &lastSeq)
		q.countAttempt()
		switch {
		case err == nil:
			if q.looked(head, age) {
				q.activeAt = q.clk.Now()
			}
			if age == nil && !q.store.seqWentBack(lastSeq, low) {
				return 0, nil
			}
		case !isTimeout(err) || ctx.Err() != nil:
			return 0, err
		}
	}
	q.countAttempt()
	timeouts := batch.timeouts
	n, err := q.store.sequence(ctx, db, batch, sequencerStatementTimeout)
	q.statsMu.Lock()
	q.stats.Batch, q.stats.Timeouts = batch.n, q.stats.Timeouts+batch.timeouts-timeouts
	q.statsMu.Unlock()
	return n, err
}

// connection returns the sequencer's own connection, made now if there is
// none, it closed (a statement cancelled by its context closes it, as does
// a lost server) or it is not idle (a transaction left open), within
// sequencerStatementTimeout.
func (q *Sequencer) connection(ctx context.Context) (*pgx.Conn, error) {
	if q.conn != nil && !q.conn.IsClosed() && q.conn.PgConn().TxStatus() == 'I' {
		return q.conn, nil
	}
	q.closeConn()
	ctx, cancel := context.WithTimeout(ctx, sequencerStatementTimeout)
	defer cancel()
	conn, err := connectLike(ctx, q.store.pool)
	if err != nil {
		return nil, fmt.Errorf("kumi: sequencer connect: %w", err)
	}
	q.conn = conn
	return conn, nil
}

// closeConn closes the sequencer's connection, if any.
func (q *Sequencer) closeConn() {
	if q.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = q.conn.Close(ctx)
	q.conn = nil
}

// connectLike opens a connection of its own (not one of the pool's) with
// pool's settings, running its BeforeConnect and AfterConnect hooks as the
// pool would.
func connectLike(ctx context.Context, pool *pgxpool.Pool) (*pgx.Conn, error) {
	cfg := pool.Config()
	cc := cfg.ConnConfig.Copy()
	if cfg.BeforeConnect != nil {
		if err := cfg.BeforeConnect(ctx, cc); err != nil {
			return nil, err
		}
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(ctx, conn); err != nil {
			_ = conn.Close(ctx)
			return nil, err
		}
	}
	return conn, nil
}

// takeOver looks at the session holding the sequencer row, once steps have
// found it held for holderCheckEvery and then at most every
// holderCheckEvery (a row held only for moments, as sequencers of several
// processes take turns, costs no look), and ends it if it has stalled (see
// queries.sequencerHolder); it reports whether it ended one. A look that
// fails (no privilege to end a session, say) is logged and changes
// nothing: the holder keeps the row until its own idle timeout, if it has
// one, ends it.
func (q *Sequencer) takeOver(ctx context.Context) bool {
	now := q.clk.Now()
	if q.heldSince.IsZero() {
		q.heldSince = now
	}
	if now.Sub(q.heldSince) < holderCheckEvery || now.Sub(q.holderAt) < holderCheckEvery {
		return false
	}
	q.holderAt = now
	var (
		pid                         int32
		app, addr, state, waitEvent string
		idle                        float64
		ended                       bool
	)
	lctx, cancel := context.WithTimeout(ctx, sequencerStatementTimeout)
	defer cancel()
	err := q.store.pool.QueryRow(lctx, q.store.sql.sequencerHolder, pgInterval(sequencerStallTimeout)).
		Scan(&pid, &app, &addr, &state, &waitEvent, &idle, &ended)
	log := q.opts.Logger
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false // freed meanwhile
	case err != nil:
		if ctx.Err() != nil {
			return false
		}
		if key := errorKey(err); key != q.holderErr {
			q.holderErr = key
			log.Warn("kumi: sequencer could not look at or end the sequencer row's holder", "err", err)
		} else {
			log.Debug("kumi: sequencer could not look at or end the sequencer row's holder", "err", err)
		}
		return false
	}
	q.holderErr = ""
	if !ended {
		return false
	}
	q.statsMu.Lock()
	q.stats.Takeovers++
	q.statsMu.Unlock()
	log.Warn("kumi: sequencer ended a stalled holder of the sequencer row", "pid", pid, "application_name", app,
		"client_addr", addr, "state", state, "wait_event", waitEvent,
		"for", time.Duration(idle*float64(time.Second)).Round(time.Millisecond))
	return true
}

// rescue looks below the search watermark for a committed append without
// a position, at most every sequencerReportInterval, and lowers the
// watermark below it (queries.sequencerStranded); it reports whether it
// did.
func (q *Sequencer) rescue(ctx context.Context) bool {
	now := q.clk.Now()
	if !q.rescuedAt.IsZero() && now.Sub(q.rescuedAt) < sequencerReportInterval {
		return false
	}
	q.rescuedAt = now
	db, err := q.connection(ctx)
	if err != nil {
		return false
	}
	lctx, cancel := context.WithTimeout(ctx, sequencerStatementTimeout)
	defer cancel()
	var seq int64
	var age float64
	var lowered bool
	err = db.QueryRow(lctx, q.store.sql.sequencerStranded).Scan(&seq, &age, &lowered)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false
	case err != nil:
		if ctx.Err() == nil {
			q.opts.Logger.Debug("kumi: sequencer could not look below its watermark", "err", err)
		}
		return false
	}
	q.statsMu.Lock()
	q.stats.Stranded++
	q.statsMu.Unlock()
	q.opts.Logger.Warn("kumi: sequencer found a committed append below its watermark without a position; "+
		"it lowered the watermark so that the append gets one (its stream's order may not hold for it)",
		"seq", seq, "age", time.Duration(age*float64(time.Second)).Round(time.Millisecond), "lowered", lowered)
	return lowered
}

func (q *Sequencer) countAttempt() {
	q.statsMu.Lock()
	q.stats.Attempts++
	q.statsMu.Unlock()
}

// looked records a look: the head, and the oldest unsequenced event's age
// in seconds (nil: none). It reports activity: the head moved or an event
// waits.
func (q *Sequencer) looked(head int64, age *float64) bool {
	now := q.clk.Now()
	q.statsMu.Lock()
	defer q.statsMu.Unlock()
	active := age != nil
	if head != q.stats.Head || q.stats.LastProgress.IsZero() {
		q.stats.Head, q.stats.LastProgress = head, now
		active = true
	}
	q.stats.BacklogAge, q.lookAt = 0, now
	if age != nil {
		q.stats.BacklogAge = max(time.Duration(*age*float64(time.Second)), time.Nanosecond)
	}
	return active
}

// record accounts for a step that sequenced n events or failed with err,
// logs what needs it, and returns the wait before the next step and
// whether it is a backoff.
func (q *Sequencer) record(ctx context.Context, n int, err error, interval time.Duration) (time.Duration, bool) {
	now := q.clk.Now()
	log := q.opts.Logger
	var reset *SequenceResetError
	if errors.As(err, &reset) {
		log.Error("kumi: sequencer found the events' sequence reset, and recovered", "err", reset)
		err = stripReset(err)
	}

	q.statsMu.Lock()
	st := &q.stats
	if reset != nil {
		st.Resets++
	}
	if err == nil {
		if st.Failing > 0 {
			log.Info("kumi: sequencer recovered", "failures", st.Failing, "after", now.Sub(st.FailingSince))
		}
		st.Failing, st.FailingSince, st.LastError, q.errKey = 0, time.Time{}, nil, ""
		if n > 0 {
			// A step that sequenced events and returned has caught up
			// with its snapshot. (One that sequenced none may have found
			// another process holding the row.)
			st.BacklogAge, q.lookAt, st.LastProgress = 0, now, now
		}
	} else {
		st.Failures++
		if st.Failing++; st.Failing == 1 {
			st.FailingSince = now
		}
		st.LastError = err
		if key := errorKey(err); key != q.errKey {
			q.errKey = key
			log.Warn("kumi: sequencer step failed", "err", err, "failures", st.Failing)
		} else {
			log.Debug("kumi: sequencer step failed", "err", err, "failures", st.Failing)
		}
	}
	st.Stuck = (st.Failing > 0 && now.Sub(st.FailingSince) >= sequencerStuckAfter) ||
		(st.BacklogAge > 0 && !st.LastProgress.IsZero() && now.Sub(st.LastProgress) >= sequencerStuckAfter)
	stuck := st.Stuck && now.Sub(q.report) >= sequencerReportInterval
	if stuck {
		q.report = now
	}
	failing := st.Failing
	q.statsMu.Unlock()

	if stuck {
		q.reportStuck(ctx)
	}
	switch {
	case failing > 0 && q.connLost:
		return backoff(sequencerRetryMin, sequencerReconnectMax, failing-1), true
	case failing > 0:
		return backoff(sequencerRetryMin, sequencerRetryMax, failing-1), true
	case n > 0:
		return q.opts.MinInterval, false
	case now.Sub(q.activeAt) >= sequencerIdleAfter:
		return q.opts.IdleInterval, false
	default:
		return min(max(interval*2, q.opts.MinInterval), q.opts.MaxInterval), false
	}
}

// serverGone reports whether err, which cost the sequencer its
// connection, says the server is away rather than refusing it: no
// PostgreSQL error at all (a refused or broken connection, a standby that
// target_session_attrs turns down), a connection exception (class 08),
// or a server shutting down or starting (57P01 to 57P03). A server that
// refuses (too many clients, a bad password) is not retried faster.
func serverGone(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return true
	}
	return strings.HasPrefix(pe.Code, "08") || strings.HasPrefix(pe.Code, "57P")
}

// stripReset returns err without its reset report: nil when that was all
// of it, the rest when Store.sequence joined a later failure to it.
func stripReset(err error) error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var rest []error
		for _, e := range j.Unwrap() {
			if !errors.Is(e, ErrSequenceReset) {
				rest = append(rest, e)
			}
		}
		return errors.Join(rest...)
	}
	if errors.Is(err, ErrSequenceReset) {
		return nil
	}
	return err
}

// errorKey tells failures apart for the log: by SQLSTATE when there is one.
func errorKey(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return err.Error()
}

// reportStuck logs why the backlog waits: the last error, how long steps
// have failed, the oldest event's age and the backlog's size (counted now,
// in a transaction with the sequencer's own timeouts, up to 1,000,000).
func (q *Sequencer) reportStuck(ctx context.Context) {
	count := int64(-1)
	_ = pgx.BeginFunc(ctx, q.store.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q.store.sql.sequencerTimeout, pgInterval(sequencerStatementTimeout)); err != nil {
			return err
		}
		return tx.QueryRow(ctx, q.store.sql.sequencerBacklog, sequencerBacklogCountMax).Scan(&count)
	})
	st := q.Stats()
	q.statsMu.Lock()
	q.stats.Backlog = count
	q.statsMu.Unlock()
	reason := "no error: the head has not moved (is another process's sequencer stuck?)"
	if st.LastError != nil {
		reason = st.LastError.Error()
	}
	q.opts.Logger.Warn("kumi: sequencer stuck: events wait for positions",
		"reason", reason, "failures", st.Failing, "failing_for", durationSince(q.clk.Now(), st.FailingSince),
		"unsequenced", count, "oldest_age", st.BacklogAge, "batch", st.Batch, "head", st.Head)
}

func durationSince(now, t time.Time) time.Duration {
	if t.IsZero() {
		return 0
	}
	return now.Sub(t)
}
