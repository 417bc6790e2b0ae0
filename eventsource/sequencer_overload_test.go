package eventsource_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// poolWithSettings returns a pool of its own whose every connection starts
// with the given server settings, as an ALTER ROLE … SET or ALTER DATABASE
// … SET of a DBA's would give it; closed when the test ends.
func poolWithSettings(t *testing.T, maxConns int32, settings map[string]string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	for k, v := range settings {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// appendBacklog appends n events, in batches of up to 1,000 to streams of
// their own, without sequencing them.
func appendBacklog(t *testing.T, s *eventsource.Store, n int) {
	t.Helper()
	for i := 0; i < n; i += 1000 {
		evs := make([]eventsource.EventData, min(1000, n-i))
		for j := range evs {
			evs[j] = ev("Burst", fmt.Sprintf(`{"i":%d,"pad":"%0200d"}`, i+j, 0))
		}
		_, err := s.Append(context.Background(), fmt.Sprintf("burst-%d", i), eventsource.Any, evs)
		require.NoError(t, err)
	}
}

// A statement_timeout set for the role or the database (here: on every
// connection of the sequencer's pool) too short for a full step of 5,000
// events must not stop the sequencer: it sets its own timeouts in its
// transaction. (Before, it retried the same step, and timed out, forever.)
func TestSequencerUnderADatabaseStatementTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	appender := newStore(t)
	const backlog = 30_000
	appendBacklog(t, appender, backlog)

	timed, err := eventsource.New(poolWithSettings(t, 4, map[string]string{"statement_timeout": "20ms", "lock_timeout": "10ms"}),
		eventsource.Config{Schema: appender.Schema()})
	require.NoError(t, err)
	q := eventsource.NewSequencer(timed, eventsource.SequencerOptions{})
	startSequencer(t, q)
	pgtest.Eventually(t, 30*time.Second, func() bool {
		h, err := appender.HeadPosition(ctx)
		return err == nil && h == backlog
	}, "every event of the backlog is sequenced")
}

// A step that its own statement timeout cancels is retried at once with
// half the batch: with a timeout too short for a full step, a large
// backlog is still sequenced, completely and in order. The backlog is
// 20,000 appends of one event each (a step's work is per append), written
// in SQL as the append statement writes them.
func TestSequenceHalvesTheBatchOnATimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	const backlog = 20_000
	_, err := s.Pool().Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.appends (seq, stream_name, first_version, last_version, category, cg_hash) OVERRIDING SYSTEM VALUE
SELECT i, 'burst-' || i, 0, 0, 'burst', %[1]s.cg_hash(i::text) FROM generate_series(1, %[2]d) AS i;
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT i, gen_random_uuid(), 'burst-' || i, 'burst', i::text, %[1]s.cg_hash(i::text), 0, 'Burst', jsonb_build_object('i', i, 'pad', repeat('x', 200))
FROM generate_series(1, %[2]d) AS i`, s.QuotedSchema(), backlog))
	require.NoError(t, err)
	_, err = s.Pool().Exec(ctx, "SELECT setval(pg_get_serial_sequence($1, 'seq'), $2)", s.QuotedSchema()+".appends", backlog)
	require.NoError(t, err)
	var timeouts int64
	pgtest.Eventually(t, 60*time.Second, func() bool {
		_, n, err := s.SequenceWithin(ctx, 10*time.Millisecond)
		timeouts += n
		// Under a loaded machine even one event may miss 10 ms: that
		// returns the timeout, and the next call goes on.
		if err != nil && !strings.Contains(err.Error(), "57014") {
			require.NoError(t, err)
		}
		h, err := s.HeadPosition(ctx)
		return err == nil && h == backlog
	}, "every event sequenced in smaller steps")
	require.Positive(t, timeouts, "a full step did not fit the timeout: the test exercised the halving")
	var n, lo, hi, distinct, disorder int64
	require.NoError(t, s.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT count(*), min(position), max(position), count(DISTINCT position),
		(SELECT count(*) FROM (SELECT position < lag(position) OVER (ORDER BY seq) AS back FROM %[1]s ev) x WHERE back)
		FROM %[1]s ev`, eventsWithPositions(s))).Scan(&n, &lo, &hi, &distinct, &disorder))
	require.Equal(t, []int64{backlog, 1, backlog, backlog, 0}, []int64{n, lo, hi, distinct, disorder},
		"positions are exactly 1..n, in insertion order")
}

// fakeClock is a Sequencer's time source that the test drives: every wait
// the sequencer asks for is handed to the test, which fires it.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers chan fakeTimer
}

type fakeTimer struct {
	d    time.Duration
	fire chan time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Unix(1_800_000_000, 0), timers: make(chan fakeTimer, 4)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.Now()
		return ch
	}
	c.timers <- fakeTimer{d, ch}
	return ch
}

// next waits for the sequencer's next wait (so: for the step before it to
// end) and returns it, unfired.
func (c *fakeClock) next(t *testing.T) fakeTimer {
	t.Helper()
	select {
	case tm := <-c.timers:
		return tm
	case <-time.After(30 * time.Second):
		t.Fatal("the sequencer asked for no wait")
		return fakeTimer{}
	}
}

// fire advances the clock by the timer's wait and fires it.
func (c *fakeClock) fire(tm fakeTimer) {
	c.mu.Lock()
	c.now = c.now.Add(tm.d)
	now := c.now
	c.mu.Unlock()
	tm.fire <- now
}

// logCounter counts log records by level and keeps the Warn messages.
type logCounter struct {
	mu    sync.Mutex
	n     map[slog.Level]int
	warns []string
}

func (h *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h *logCounter) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *logCounter) WithGroup(string) slog.Handler            { return h }
func (h *logCounter) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == nil {
		h.n = map[slog.Level]int{}
	}
	h.n[r.Level]++
	if r.Level == slog.LevelWarn {
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			fmt.Fprintf(&b, " %s=%v", a.Key, a.Value)
			return true
		})
		h.warns = append(h.warns, b.String())
	}
	return nil
}

func (h *logCounter) count(l slog.Level) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n[l]
}

// Against a database that refuses every step (read-only), the sequencer
// backs off exponentially, with jitter, up to SequencerRetryMax: over 40
// s of its clock it tries a bounded number of times (before: every 50 ms,
// 800 times, each with a warning); it warns once for the failure and then
// reports itself stuck, with the reason, every SequencerReportInterval.
func TestSequencerBacksOffOnErrors(t *testing.T) {
	t.Parallel()
	s := newStore(t)
	mustAppend(t, s, "order-1", ev("A", `{}`))
	ro, err := eventsource.New(poolWithSettings(t, 2, map[string]string{"default_transaction_read_only": "on"}),
		eventsource.Config{Schema: s.Schema()})
	require.NoError(t, err)
	logs := &logCounter{}
	clk := newFakeClock()
	q := eventsource.NewSequencerWithClock(ro, eventsource.SequencerOptions{Logger: slog.New(logs)}, clk)
	startSequencer(t, q)

	const window = 40 * time.Second
	var waited time.Duration
	for waited < window {
		tm := clk.next(t)
		waited += tm.d
		clk.fire(tm)
	}
	clk.next(t) // the step after the last wait has ended
	st := q.Stats()

	// The fewest waits that fill the window: each at least half its
	// ceiling, the ceiling doubling from SequencerRetryMin up to
	// SequencerRetryMax.
	most, least := 1, 1+int(window/eventsource.SequencerRetryMax)
	for sum, c := time.Duration(0), eventsource.SequencerRetryMin; sum < window; most++ {
		sum += c / 2
		c = min(2*c, eventsource.SequencerRetryMax)
	}
	t.Logf("%d failed steps, %d attempts over %v; %d warnings", st.Failures, st.Attempts, waited, logs.count(slog.LevelWarn))
	require.LessOrEqual(t, st.Failures, int64(most), "failed steps are spaced by the backoff")
	require.GreaterOrEqual(t, st.Failures, int64(least), "and retried without end")
	require.LessOrEqual(t, st.Attempts, 2*st.Failures, "a look and a step per try")
	require.Equal(t, int(st.Failures), st.Failing)
	require.ErrorContains(t, st.LastError, "read-only")
	require.True(t, st.Stuck)
	require.Equal(t, int64(1), st.Backlog, "the stuck report counted the waiting event")
	require.Positive(t, st.BacklogAge)

	// One warning for the failure, then one stuck report per interval
	// once stuck.
	warns := logs.count(slog.LevelWarn)
	require.LessOrEqual(t, warns, 2+int((window-eventsource.SequencerStuckAfter)/eventsource.SequencerReportInterval), logs.warns)
	require.GreaterOrEqual(t, warns, 2, logs.warns)
	require.Contains(t, logs.warns[len(logs.warns)-1], "stuck")
	require.Contains(t, logs.warns[len(logs.warns)-1], "read-only", "the report says why")
}

// Events that wait while the head does not move, without any error (here:
// another "process" holds the sequencer row and runs a long statement: a
// holder at work, which no sequencer ends, unlike a stalled one), are
// reported as stuck too, with that as the reason; it clears once the head
// moves again.
func TestSequencerReportsABacklogThatDoesNotMove(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	mustAppend(t, s, "order-1", ev("A", `{}`))
	holder, err := s.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = holder.Rollback(ctx) }()
	_, err = holder.Exec(ctx, "SELECT 1 FROM "+s.QuotedSchema()+".sequencer FOR UPDATE")
	require.NoError(t, err)
	worker := holder.Conn().PgConn().PID()
	worked := make(chan error, 1)
	go func() {
		_, err := holder.Exec(ctx, "SELECT pg_sleep(600)")
		worked <- err
	}()

	other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: s.Schema()})
	require.NoError(t, err)
	logs := &logCounter{}
	clk := newFakeClock()
	q := eventsource.NewSequencerWithClock(other, eventsource.SequencerOptions{Logger: slog.New(logs), MaxInterval: time.Second}, clk)
	startSequencer(t, q)
	var waited time.Duration
	for waited <= eventsource.SequencerStuckAfter {
		tm := clk.next(t)
		waited += tm.d
		clk.fire(tm)
	}
	tm := clk.next(t)
	st := q.Stats()
	require.True(t, st.Stuck)
	require.Zero(t, st.Failures, "nothing failed")
	require.Equal(t, int64(1), st.Backlog)
	require.Len(t, logs.warns, 1, "one stuck report")
	require.Contains(t, logs.warns[0], "head has not moved")

	_, err = s.Pool().Exec(ctx, "SELECT pg_cancel_backend($1)", worker)
	require.NoError(t, err)
	require.ErrorContains(t, <-worked, "canceling statement", "the holder at work was cancelled here, not ended before")
	require.NoError(t, holder.Rollback(ctx))
	require.Zero(t, st.Takeovers, "a holder at work is never ended")
	for i := 0; st.Stuck; i++ {
		require.Less(t, i, 100, "still stuck after the row was freed")
		clk.fire(tm)
		tm = clk.next(t)
		st = q.Stats()
	}
	h, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), h, "sequenced once the row is free")
}

// Against a server that is gone (nothing listens on its port, as while a
// failover promotes a standby), the sequencer retries its connection
// with a backoff capped at SequencerReconnectMax, not SequencerRetryMax:
// the new primary is found within it once it accepts (it waited up to 5
// s, most of the delay before the first delivery after a promotion).
func TestSequencerRetriesALostServerWithinReconnectMax(t *testing.T) {
	t.Parallel()
	port, err := pgtest.FreePort()
	require.NoError(t, err)
	gone, err := eventsource.New(pgtest.PoolOn(t, fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=5", port), 2),
		eventsource.Config{})
	require.NoError(t, err)
	clk := newFakeClock()
	q := eventsource.NewSequencerWithClock(gone, eventsource.SequencerOptions{}, clk)
	startSequencer(t, q)
	for range 12 { // past the doubling's reach of SequencerRetryMax
		tm := clk.next(t)
		require.LessOrEqual(t, tm.d, eventsource.SequencerReconnectMax, "a wait between connection attempts")
		clk.fire(tm)
	}
	clk.next(t)
	st := q.Stats()
	require.GreaterOrEqual(t, st.Failures, int64(12))
	require.ErrorContains(t, st.LastError, "sequencer connect")
}

// A sequencer that has seen no activity for SequencerIdleAfter looks once
// per IdleInterval, not per MaxInterval: a quiet process sends 1 look a
// second, not 20 (before, it looked every 50 ms for ever). Another
// process's append is still found, at the next look, and the looks are
// fast again after it.
func TestAnIdleSequencerLooksOncePerIdleInterval(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	other, err := eventsource.New(pgtest.NewPool(t, 2), eventsource.Config{Schema: s.Schema()})
	require.NoError(t, err)
	clk := newFakeClock()
	q := eventsource.NewSequencerWithClock(s, eventsource.SequencerOptions{}, clk)
	startSequencer(t, q)
	const maxInterval, idleInterval = 50 * time.Millisecond, time.Second
	// Quiet: the waits back off to MaxInterval, then to IdleInterval once
	// SequencerIdleAfter has passed without activity.
	var waited time.Duration
	looks := 0
	for {
		tm := clk.next(t)
		if tm.d == idleInterval {
			clk.fire(tm)
			break
		}
		require.LessOrEqual(t, tm.d, maxInterval, "a wait before the sequencer is idle (after %v, %d looks)", waited, looks)
		require.Less(t, waited, 2*eventsource.SequencerIdleAfter, "still looking every %v after %v of quiet", tm.d, waited)
		waited += tm.d
		looks++
		clk.fire(tm)
	}
	require.GreaterOrEqual(t, waited, eventsource.SequencerIdleAfter, "idle before SequencerIdleAfter of quiet")
	for range 3 {
		tm := clk.next(t)
		require.Equal(t, idleInterval, tm.d, "an idle sequencer's wait")
		clk.fire(tm)
	}
	// Another process's append (it does not wake this sequencer) is found
	// at the next look, and the looks after it are fast again. The append
	// is made once the look the last fire began has ended (its next wait is
	// set): made while that look runs, the look could find it, and the
	// wait after it be a fast one (a loaded machine did that).
	tm := clk.next(t)
	require.Equal(t, idleInterval, tm.d)
	mustAppend(t, other, "order-1", ev("A", `{}`))
	clk.fire(tm)
	tm = clk.next(t)
	require.LessOrEqual(t, tm.d, maxInterval, "the wait after a step that sequenced")
	h, err := s.HeadPosition(ctx)
	require.NoError(t, err)
	require.Equal(t, int64(1), h, "the other process's append was sequenced")
	for range 5 {
		clk.fire(tm)
		tm = clk.next(t)
		require.LessOrEqual(t, tm.d, maxInterval, "a wait soon after activity")
	}
}
