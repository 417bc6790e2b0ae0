package eventsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	retry "github.com/kumi-run/kumi/internal/backoff"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/kumierr"
)

// PageReader reads the pages a subscription catches up and follows with:
// a bucket's events, or every event, after a position. [Store] reads them
// on the primary; a [ReadReplica] on a hot standby of it.
//
// A page that is not full — fewer than [Page.Limit] events, and less than
// [Page.MaxBytes] of them when MaxBytes > 0 — holds every event of the read
// in (After, Known]. A full page holds the first events after After, with
// no gap. So a caller that moves its cursor to Known after a page that is
// not full skips nothing, wherever the page was read.
type PageReader interface {
	// ReadBucketPage reads a page of the events of bucket of a group of
	// buckets over category, in global order, bounded as
	// [Store.ReadBucketBounded] is.
	ReadBucketPage(ctx context.Context, category string, bucket, buckets int, p Page) ([]RecordedEvent, error)
	// ReadAllPage reads a page of $all, bounded as [Store.ReadAllBounded]
	// is.
	ReadAllPage(ctx context.Context, p Page) ([]RecordedEvent, error)
	// HeadPosition returns the highest position the reader's database
	// shows.
	HeadPosition(ctx context.Context) (int64, error)
}

// Page is one read of a [PageReader].
type Page struct {
	// After is the position the page starts after.
	After int64
	// Known is a position the caller already knows was handed out (from a
	// notification, a checkpoint or an earlier page): a page that is not
	// full covers (After, Known]. The primary shows every position it
	// handed out, so [Store] needs none; a [ReadReplica] waits for its
	// standby to show Known.
	Known int64
	// Limit is the most events the page holds (0 or less: 1,000, as
	// [Store.ReadAll]).
	Limit int
	// MaxBytes bounds the page's size as [Store.ReadAllBounded] does (0 or
	// less: no bound).
	MaxBytes int64
}

// ReadBucketPage is [Store.ReadBucketBounded]. The primary shows every
// position it handed out, so a page read here covers any known head.
func (s *Store) ReadBucketPage(ctx context.Context, category string, bucket, buckets int, p Page) ([]RecordedEvent, error) {
	return s.ReadBucketBounded(ctx, category, bucket, buckets, p.After, p.Limit, p.MaxBytes)
}

// ReadAllPage is [Store.ReadAllBounded]; see [Store.ReadBucketPage].
func (s *Store) ReadAllPage(ctx context.Context, p Page) ([]RecordedEvent, error) {
	return s.ReadAllBounded(ctx, p.After, p.Limit, p.MaxBytes)
}

// Defaults of [ReadReplicaOptions].
const (
	ReplicaWaitDefault        = time.Second
	ReplicaLagIntervalDefault = time.Second
	ReplicaWarnLagDefault     = 30 * time.Second
	// ReplicaWaitMax is the most Wait may be: more than any caller's
	// timeout in kumi (a reader's DatabaseTimeout, 30 s by default, and
	// the publisher's 30 s) would be cut to half the caller's time
	// anyway (see ReadReplicaOptions.Wait).
	ReplicaWaitMax = time.Minute
)

// ReadReplicaOptions tune a [ReadReplica]. The zero value of every field
// means its default.
type ReadReplicaOptions struct {
	// Wait bounds how long one read waits for the standby to show the
	// head its caller knows (retrying the standby with a short backoff)
	// before it reads the page on the primary instead. Default 1 s, at
	// most ReplicaWaitMax. A read whose context has a deadline gives the
	// standby at most half the time left, Wait or not, and keeps the
	// other half for the primary: a paused or hung standby never makes a
	// read fail that the primary could serve.
	Wait time.Duration
	// LagInterval is how often the standby's lag is measured. Default 1 s.
	LagInterval time.Duration
	// WarnLag: when the lag passes it, "kumi: read replica lagging" is
	// logged at Warn (once, and "kumi: read replica caught up" at Info when
	// it is back under). Default 30 s; negative turns the line off.
	WarnLag time.Duration
	// FallbackLag, when positive, sends every read to the primary while
	// the lag is past it, and back to the standby once it is not. Default
	// 0: off (reads past Wait still fall back one by one).
	FallbackLag time.Duration
	// Logger receives the lag lines and standby failures; nil discards
	// them.
	Logger *slog.Logger
}

func (o ReadReplicaOptions) withDefaults() ReadReplicaOptions {
	if o.Wait == 0 {
		o.Wait = ReplicaWaitDefault
	}
	if o.LagInterval == 0 {
		o.LagInterval = ReplicaLagIntervalDefault
	}
	if o.WarnLag == 0 {
		o.WarnLag = ReplicaWarnLagDefault
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o ReadReplicaOptions) validate() error {
	switch {
	case o.Wait < 0 || o.Wait > ReplicaWaitMax:
		return &kumierr.ConfigError{Field: "eventsource.ReadReplicaOptions.Wait", Value: o.Wait, Reason: fmt.Sprintf("must be in [0, %v] (0 means %v): a longer wait would never end before its caller's timeout",
			ReplicaWaitMax, ReplicaWaitDefault)}
	case o.LagInterval < 0 || o.LagInterval > time.Hour:
		return &kumierr.ConfigError{Field: "eventsource.ReadReplicaOptions.LagInterval", Value: o.LagInterval, Reason: fmt.Sprintf("must be in [0, 1h] (0 means %v)", ReplicaLagIntervalDefault)}
	case o.FallbackLag < 0:
		return &kumierr.ConfigError{Field: "eventsource.ReadReplicaOptions.FallbackLag", Value: o.FallbackLag, Reason: "must not be negative (0 means never)"}
	}
	return nil
}

// ReadReplicaStats is a snapshot of a [ReadReplica]: its lag as last
// measured, and where its reads went.
type ReadReplicaStats struct {
	// LagEvents is the primary's head minus the standby's: the sequenced
	// events the standby does not show yet.
	LagEvents int64
	// Lag is how long ago the primary had a head the standby does not
	// show yet (0 when it shows the primary's head), to within
	// LagInterval.
	Lag time.Duration
	// PrimaryHead and StandbyHead are the heads last measured, at
	// MeasuredAt (zero before the first measurement).
	PrimaryHead, StandbyHead int64
	MeasuredAt               time.Time
	// Err is the last measurement's failure, nil when it succeeded.
	Err error
	// FallingBack reports whether reads go to the primary: the lag is
	// past FallbackLag, or the standby could not be measured.
	FallingBack bool
	// StandbyReads counts the pages read on the standby, PrimaryReads
	// those read on the primary instead (fallbacks), and Retries the
	// standby reads that showed less than their caller knew and were
	// tried again.
	StandbyReads, PrimaryReads, Retries int64
}

// ReadReplica is a [PageReader] on a hot standby of a store's primary: see
// docs/design/eventsource.md, "Reading from a hot standby". Every read takes the
// standby's head and then the page on one connection, so the page's
// snapshot shows at least that head, with no gap below it (the standby
// shows the positions 1..head); a page that is not full and ends below the
// head its caller knows is not trusted: it is read again after a short
// backoff, for at most Wait, then on the primary. A standby error sends
// the read to the primary too. Nothing else goes to the standby.
//
// Start runs the lag measurement (its stats, the Warn line, FallbackLag);
// reads work without it.
type ReadReplica struct {
	primary *Store
	standby *pgxpool.Pool
	// onStandby is primary's schema over standby.
	onStandby *Store
	opts      ReadReplicaOptions
	pause     retry.Policy

	standbyReads, primaryReads, retries atomic.Int64
	fallingBack                         atomic.Bool
	// checked is set once a Check found the standby fit; mismatch holds
	// the last Check's refusal (nil when fit).
	checked  atomic.Bool
	mismatch atomic.Pointer[kumierr.ConfigError]

	mu      sync.Mutex
	stats   ReadReplicaStats
	track   lagTracker
	warned  bool
	failing bool
	life    startstop.Lifecycle
}

// NewReadReplica returns a ReadReplica reading primary's schema through
// standby, a pool on a hot standby of primary's database.
func NewReadReplica(primary *Store, standby *pgxpool.Pool, opts ReadReplicaOptions) (*ReadReplica, error) {
	if primary == nil {
		return nil, &kumierr.ConfigError{Field: "eventsource primary", Reason: "is nil"}
	}
	if standby == nil {
		return nil, &kumierr.ConfigError{Field: "eventsource standby", Reason: "is nil"}
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	onStandby, err := New(standby, primary.cfg)
	if err != nil {
		return nil, err
	}
	return &ReadReplica{primary: primary, standby: standby, onStandby: onStandby, opts: opts.withDefaults(),
		pause: retry.Policy{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond, Multiplier: 2, Jitter: retry.Equal}}, nil
}

// Pool returns the standby's pool.
func (r *ReadReplica) Pool() *pgxpool.Pool { return r.standby }

// ReadBucketPage reads as [Store.ReadBucketBounded] does, on the standby.
func (r *ReadReplica) ReadBucketPage(ctx context.Context, category string, bucket, buckets int, p Page) ([]RecordedEvent, error) {
	if err := ValidateCategory(category); err != nil {
		return nil, err
	}
	if err := checkGroup(bucket, buckets); err != nil {
		return nil, err
	}
	return r.read(ctx, bounds{limitOf(p.Limit), p.MaxBytes}, p.After, p.Known, bucketRead(r.primary.q, buckets),
		category, bucket, p.After, limitOf(p.Limit))
}

// ReadAllPage reads as [Store.ReadAllBounded] does, on the standby.
func (r *ReadReplica) ReadAllPage(ctx context.Context, p Page) ([]RecordedEvent, error) {
	return r.read(ctx, bounds{limitOf(p.Limit), p.MaxBytes}, p.After, p.Known, r.primary.sql.readAll, p.After, limitOf(p.Limit))
}

// HeadPosition returns the standby's head, or the primary's while reads
// fall back to it or the standby fails.
func (r *ReadReplica) HeadPosition(ctx context.Context) (int64, error) {
	if err := r.verified(ctx); err != nil {
		return 0, err
	}
	if !r.fallingBack.Load() {
		var h int64
		if err := r.standby.QueryRow(ctx, r.primary.sql.headPosition).Scan(&h); err == nil || ctx.Err() != nil {
			return h, err
		}
	}
	return r.primary.HeadPosition(ctx)
}

// BucketLag is [Store.BucketLag] on the standby — a count of the
// bucket's events after a checkpoint, as of the standby's replay (so
// short by the bucket's share of the lag) — or on the primary while reads
// fall back to it or when the standby fails.
func (r *ReadReplica) BucketLag(ctx context.Context, category string, bucket, buckets int, after int64) (int64, time.Time, error) {
	return r.BucketLagUntil(ctx, category, bucket, buckets, after, math.MaxInt64)
}

// BucketLagUntil is [Store.BucketLagUntil] on the standby, as BucketLag is
// [Store.BucketLag].
func (r *ReadReplica) BucketLagUntil(ctx context.Context, category string, bucket, buckets int, after, until int64) (int64, time.Time, error) {
	if err := r.verified(ctx); err != nil {
		return 0, time.Time{}, err
	}
	if !r.fallingBack.Load() {
		n, oldest, err := r.onStandby.BucketLagUntil(ctx, category, bucket, buckets, after, until)
		if err == nil || ctx.Err() != nil {
			return n, oldest, err
		}
	}
	return r.primary.BucketLagUntil(ctx, category, bucket, buckets, after, until)
}

// BucketLags is [Store.BucketLags] on the standby — checkpoints and
// backlogs as of the standby's replay, from one snapshot — or on the
// primary while reads fall back to it or when the standby fails.
func (r *ReadReplica) BucketLags(ctx context.Context, buckets []LagBucket) ([]BucketBacklog, error) {
	if err := r.verified(ctx); err != nil {
		return nil, err
	}
	if !r.fallingBack.Load() {
		out, err := r.onStandby.BucketLags(ctx, buckets)
		if err == nil || ctx.Err() != nil {
			return out, err
		}
	}
	return r.primary.BucketLags(ctx, buckets)
}

// read reads one page on the standby until it covers known (see
// [PageReader]), for at most Wait and half of ctx's time left, and on the
// primary otherwise.
func (r *ReadReplica) read(ctx context.Context, b bounds, after, known int64, rs readSQL, args ...any) ([]RecordedEvent, error) {
	if err := r.verified(ctx); err != nil {
		return nil, err
	}
	if !r.fallingBack.Load() {
		sctx, cancel := standbyContext(ctx)
		defer cancel()
		deadline := time.Now().Add(r.opts.Wait)
		for attempt := 1; ; attempt++ {
			events, head, err := r.readStandby(sctx, b, rs, args)
			if err != nil {
				if ctx.Err() != nil {
					return nil, err
				}
				r.opts.Logger.Debug("kumi: read replica: a standby read failed; reading the page on the primary", "err", err)
				break
			}
			if head >= known || known <= after || b.full(events) {
				r.standbyReads.Add(1)
				return events, nil
			}
			if !time.Now().Before(deadline) {
				break
			}
			r.retries.Add(1)
			if !retry.Sleep(sctx, r.pause.Next(attempt)) {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				break // the standby's half of the time is over
			}
		}
	}
	r.primaryReads.Add(1)
	return r.primary.queryBounded(ctx, r.primary.pool, b, rs, args...)
}

// standbyContext returns ctx for the standby's part of a read: when ctx
// has a deadline, one at half the time left, so that the primary has the
// other half.
func standbyContext(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
}

// readStandby reads the standby's head, then the page, on one connection:
// the page's snapshot is taken after the head's, on the same server, so it
// shows every position up to that head.
func (r *ReadReplica) readStandby(ctx context.Context, b bounds, rs readSQL, args []any) ([]RecordedEvent, int64, error) {
	conn, err := r.standby.Acquire(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Release()
	var head int64
	if err := conn.QueryRow(ctx, r.primary.sql.headPosition).Scan(&head); err != nil {
		return nil, 0, err
	}
	events, err := r.primary.queryBounded(ctx, conn, b, rs, args...)
	return events, head, err
}

// full reports whether events fill b: a page that does not may end before
// the end of what its snapshot shows only by its byte or event bound.
func (b bounds) full(events []RecordedEvent) bool {
	if len(events) >= b.events {
		return true
	}
	if b.bytes <= 0 {
		return false
	}
	var n int64
	for i := range events {
		n += events[i].Size()
	}
	return n >= b.bytes
}

// Start checks the standby (see [ReadReplica.Check]) and measures the lag
// every LagInterval until Stop. Start and Stop follow kumi's lifecycle
// contract (docs/design/architecture.md, "Lifecycle"): ctx bounds the start
// only; Stop is final and idempotent. A read pool that is not a standby
// of the primary is refused: Start returns the Check's refusal
// ([ErrReplicaMismatch]). One that cannot be reached now is not: reads go
// to the primary until it can. Reads work whether or not it runs.
func (r *ReadReplica) Start(ctx context.Context) error {
	return r.life.Start(ctx, func(ctx context.Context) error {
		if err := r.Check(ctx); errors.Is(err, ErrReplicaMismatch) {
			return err
		}
		r.life.Go(r.run)
		return nil
	})
}

// Stop stops the lag measurement and waits for it (ctx bounds the wait).
func (r *ReadReplica) Stop(ctx context.Context) error { return r.life.Stop(ctx, nil) }

func (r *ReadReplica) run(ctx context.Context) {
	t := time.NewTicker(r.opts.LagInterval)
	defer t.Stop()
	for {
		r.measure(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// measure measures the lag once (Start does it every LagInterval) and
// returns the stats it leaves.
func (r *ReadReplica) measure(ctx context.Context) ReadReplicaStats {
	c, cancel := context.WithTimeout(ctx, max(r.opts.LagInterval, time.Second))
	defer cancel()
	var primary, standby int64
	err := r.Check(c)
	if err == nil {
		err = r.primary.pool.QueryRow(c, r.primary.sql.headPosition).Scan(&primary)
	}
	if err != nil {
		err = fmt.Errorf("primary: %w", err)
	} else if err = r.standby.QueryRow(c, r.primary.sql.headPosition).Scan(&standby); err != nil {
		err = fmt.Errorf("standby: %w", err)
	}
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil && !r.failing {
			r.opts.Logger.Warn("kumi: read replica: cannot measure the standby's lag; reads go to the primary until it can", "err", err)
		}
		r.failing = ctx.Err() == nil
		r.stats.Err = err
		r.fallingBack.Store(r.failing || r.stats.FallingBack)
		return r.statsLocked()
	}
	if r.failing {
		r.opts.Logger.Info("kumi: read replica: the standby's lag can be measured again")
	}
	r.failing = false
	lag := r.track.observe(now, primary, standby)
	r.stats.Err = nil
	r.stats.PrimaryHead, r.stats.StandbyHead, r.stats.MeasuredAt = primary, standby, now
	r.stats.LagEvents = max(primary-standby, 0)
	r.stats.Lag = lag
	r.stats.FallingBack = r.opts.FallbackLag > 0 && lag > r.opts.FallbackLag
	r.fallingBack.Store(r.stats.FallingBack)
	if w := r.opts.WarnLag; w > 0 {
		switch {
		case lag > w && !r.warned:
			r.warned = true
			r.opts.Logger.Warn("kumi: read replica lagging", "lag", lag, "lag_events", r.stats.LagEvents,
				"warn_lag", w, "falling_back", r.stats.FallingBack)
		case lag <= w && r.warned:
			r.warned = false
			r.opts.Logger.Info("kumi: read replica caught up", "lag", lag, "lag_events", r.stats.LagEvents)
		}
	}
	return r.statsLocked()
}

// Stats returns a snapshot of the lag last measured and the reads so far.
func (r *ReadReplica) Stats() ReadReplicaStats {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.statsLocked()
}

func (r *ReadReplica) statsLocked() ReadReplicaStats {
	st := r.stats
	st.FallingBack = r.fallingBack.Load()
	st.StandbyReads, st.PrimaryReads, st.Retries = r.standbyReads.Load(), r.primaryReads.Load(), r.retries.Load()
	return st
}

// lagTracker turns measurements of the primary's and the standby's heads
// into a lag in time: how long ago the primary had a head the standby does
// not show yet. It keeps the primary heads measured that the standby has
// not reached, oldest first.
type lagTracker struct {
	samples []lagSample
}

type lagSample struct {
	at   time.Time
	head int64
}

// maxLagSamples bounds the samples kept: past it every other one but the
// oldest is dropped, so the lag stays exact while the oldest is unreached
// and is understated by at most the gap thinning left after it.
const maxLagSamples = 256

func (l *lagTracker) observe(now time.Time, primary, standby int64) time.Duration {
	i := 0
	for i < len(l.samples) && l.samples[i].head <= standby {
		i++
	}
	l.samples = l.samples[i:]
	if n := len(l.samples); primary > standby && (n == 0 || l.samples[n-1].head < primary) {
		l.samples = append(l.samples, lagSample{now, primary})
	}
	if len(l.samples) > maxLagSamples {
		kept := l.samples[:1]
		for j := 2; j < len(l.samples); j += 2 {
			kept = append(kept, l.samples[j])
		}
		l.samples = kept
	}
	if len(l.samples) == 0 {
		return 0
	}
	return now.Sub(l.samples[0].at)
}

// ErrReplicaMismatch is the Err of the *kumierr.ConfigError that refuses
// a read pool ([ReadReplica]) reaching neither a hot standby of the
// store's primary nor the primary itself: another cluster, another
// database, or a primary of another timeline. Its events are not the
// store's: a subscription reading them would deliver them as its own and
// checkpoint past the real ones. Test for it with errors.Is; the error's
// Field is "eventsource standby" and its Reason names what differs and
// both sides' values.
var ErrReplicaMismatch = errors.New("kumi: the read pool is not a standby of the store's primary")

// replicaMismatch is the refusal of a read pool whose what (the system
// identifier, the database or the timeline) is standby where the
// primary's is primary.
func replicaMismatch(what, primary, standby string) *kumierr.ConfigError {
	return &kumierr.ConfigError{Field: "eventsource standby", Err: ErrReplicaMismatch, Reason: fmt.Sprintf(
		"its %s is %s, the primary's %s: it is not a standby of the store's primary (check the read pool's URL)", what, standby, primary)}
}

// replicaSide is what Check compares of a pool's server.
type replicaSide struct {
	system   uint64
	database string
	recovery bool
	timeline uint32 // 0 on a standby
}

func readSide(ctx context.Context, pool *pgxpool.Pool) (replicaSide, error) {
	var side replicaSide
	err := pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error {
		var err error
		if side.system, err = systemID(ctx, c.Conn()); err != nil {
			return err
		}
		var wal string
		if err := c.QueryRow(ctx, `SELECT current_database(), pg_is_in_recovery(),
  CASE WHEN pg_is_in_recovery() THEN '' ELSE pg_walfile_name(pg_current_wal_lsn()) END`).Scan(&side.database, &side.recovery, &wal); err != nil {
			return err
		}
		if !side.recovery {
			side.timeline, err = walTimeline(wal)
		}
		return err
	})
	return side, err
}

// Check compares the read pool's server with the primary's: it must be a
// hot standby of the same cluster (system identifier, where both may read
// it) and database, or a server of the same cluster, database and
// timeline (the primary itself). Otherwise it returns a
// *[kumierr.ConfigError] wrapping [ErrReplicaMismatch], and reads fail
// with it until a Check finds the pool fit again. Start checks, and so does every measurement of the lag;
// a read made before the first successful check checks first.
func (r *ReadReplica) Check(ctx context.Context) error {
	p, err := readSide(ctx, r.primary.pool)
	if err != nil {
		return fmt.Errorf("kumi: read replica: read the primary's identity: %w", err)
	}
	sb, err := readSide(ctx, r.standby)
	if err != nil {
		return fmt.Errorf("kumi: read replica: read the standby's identity: %w", err)
	}
	var m *kumierr.ConfigError
	switch {
	case p.system != 0 && sb.system != 0 && p.system != sb.system:
		m = replicaMismatch("system identifier", fmt.Sprint(p.system), fmt.Sprint(sb.system))
	case p.database != sb.database:
		m = replicaMismatch("database", pgx.Identifier{p.database}.Sanitize(), pgx.Identifier{sb.database}.Sanitize())
	case !sb.recovery && sb.timeline != p.timeline:
		m = replicaMismatch("timeline", fmt.Sprint(p.timeline), fmt.Sprintf("%d (a primary, not in recovery)", sb.timeline))
	}
	r.mismatch.Store(m)
	if m != nil {
		return m
	}
	r.checked.Store(true)
	return nil
}

// verified returns the last Check's refusal, or — before any Check found
// the pool fit — checks now. A check that fails for another reason (the
// standby unreachable) leaves the read to go on: it falls back to the
// primary.
func (r *ReadReplica) verified(ctx context.Context) error {
	if m := r.mismatch.Load(); m != nil {
		return m
	}
	if r.checked.Load() {
		return nil
	}
	if err := r.Check(ctx); errors.Is(err, ErrReplicaMismatch) {
		return err
	}
	return nil
}
