package eventsource_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// The tests of the read pool: a ReadReplica, against a real standby, under
// the rule a subscription follows — after a page that is not full its
// cursor moves to the head it knows (from a notification, a checkpoint or
// a batch). The argument is in docs/design/eventsource.md, "Reading from a hot
// standby"; standby_test.go plays it on the standby's plain reads.

// pageFollower reads $all through a PageReader as a subscription does, and
// checks what it gets: every position once, in order, none skipped.
type pageFollower struct {
	pr     eventsource.PageReader
	cursor int64 // moved past what was read, and to known after a page that is not full
	last   int64 // the last position read
	read   int
}

// step reads one page of at most limit events knowing head known.
func (f *pageFollower) step(ctx context.Context, known int64, limit int) (int, error) {
	events, err := f.pr.ReadAllPage(ctx, eventsource.Page{After: f.cursor, Known: known, Limit: limit})
	if err != nil {
		return 0, err
	}
	for _, e := range events {
		if e.Position != f.last+1 {
			return 0, fmt.Errorf("after position %d the read returned %d: skipped or reordered", f.last, e.Position)
		}
		f.last, f.cursor = e.Position, e.Position
		f.read++
	}
	if len(events) < limit {
		f.cursor = max(f.cursor, known) // the rule: the page covered known
		if f.last < f.cursor {
			return 0, fmt.Errorf("a page that was not full ended at %d below the known head %d: the cursor skipped", f.last, known)
		}
	}
	return len(events), nil
}

// upTo steps until the cursor reaches known.
func (f *pageFollower) upTo(t *testing.T, known int64) {
	t.Helper()
	for f.cursor < known {
		_, err := f.step(context.Background(), known, 7)
		require.NoError(t, err)
	}
}

// waitRetrying waits until the read under way (its result on done) is
// retrying the paused standby r, then resumes replay. A read that returns
// while replay is paused fails the test with its error.
func waitRetrying(t *testing.T, rr *eventsource.ReadReplica, r *pgtest.Replica, done chan error) {
	t.Helper()
	defer func() { require.NoError(t, r.ResumeReplay(context.Background())) }()
	pgtest.Eventually(t, time.Minute, func() bool { return rr.Stats().Retries > 0 || len(done) > 0 },
		"the read retries the standby below the head its caller knows")
	if len(done) > 0 {
		require.NoError(t, <-done, "the read returned while replay was paused")
		require.Fail(t, "the read returned while replay was paused, below the head its caller knows")
	}
}

func newReadReplica(t *testing.T, p *eventsource.Store, r *pgtest.Replica, opts eventsource.ReadReplicaOptions) *eventsource.ReadReplica {
	t.Helper()
	rr, err := eventsource.NewReadReplica(p, pgtest.PoolOn(t, r.URL, 10), opts)
	require.NoError(t, err)
	return rr
}

func TestReadReplicaRefusesBadOptions(t *testing.T) {
	p := newStore(t)
	for field, o := range map[string]eventsource.ReadReplicaOptions{
		"Wait":        {Wait: -time.Second},
		"LagInterval": {LagInterval: 2 * time.Hour},
		"FallbackLag": {FallbackLag: -1},
	} {
		_, err := eventsource.NewReadReplica(p, p.Pool(), o)
		var ce *kumierr.ConfigError
		require.ErrorAs(t, err, &ce, field)
		require.Equal(t, "eventsource.ReadReplicaOptions."+field, ce.Field)
	}
	_, err := eventsource.NewReadReplica(p, nil, eventsource.ReadReplicaOptions{})
	var ce *kumierr.ConfigError
	require.ErrorAs(t, err, &ce)
	require.Equal(t, "eventsource standby", ce.Field)
	_, err = eventsource.NewReadReplica(p, p.Pool(), eventsource.ReadReplicaOptions{Wait: eventsource.ReplicaWaitMax + time.Second})
	require.ErrorAs(t, err, &ce, "a Wait past every caller's timeout")
	require.Equal(t, "eventsource.ReadReplicaOptions.Wait", ce.Field)
}

// TestReadReplica: the points of the argument, each with the follower's
// rule, on one standby; they run in order, since they pause its replay.
func TestReadReplica(t *testing.T) {
	ctx := context.Background()
	p, srv := localStore(t)
	r := pgtest.NewReplica(t, srv)

	t.Run("NotificationAheadOfReplay", func(t *testing.T) {
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: eventsource.ReplicaWaitMax})
		f := &pageFollower{pr: rr}
		appendN(t, p, 5)
		sequenceAll(t, p)
		f.upTo(t, head(t, p))

		require.NoError(t, r.PauseReplay(ctx))
		appendN(t, p, 9)
		sequenceAll(t, p)
		notified := head(t, p)
		plain, err := onStandby(t, r, p).ReadAll(ctx, f.cursor, 100)
		require.NoError(t, err)
		require.Empty(t, plain, "the paused standby shows none of the notified events: a plain read would let the rule skip them")

		done := make(chan error, 1)
		go func() {
			_, err := f.step(ctx, notified, 100)
			done <- err
		}()
		waitRetrying(t, rr, r, done)
		require.NoError(t, <-done)
		require.Equal(t, notified, f.last, "the page covered the notified head")
		st := rr.Stats()
		require.Zero(t, st.PrimaryReads, "every page came from the standby")
		require.Positive(t, st.StandbyReads)
	})

	t.Run("CheckpointAheadOfReplay", func(t *testing.T) {
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: eventsource.ReplicaWaitMax})
		require.NoError(t, r.WaitReplayed(ctx))
		from := head(t, p)
		require.NoError(t, r.PauseReplay(ctx))
		appendN(t, p, 6)
		sequenceAll(t, p)
		_, err := p.SaveCheckpoint(ctx, "replica", 0, from+4, nil)
		require.NoError(t, err)
		cp, err := p.Checkpoint(ctx, "replica", 0) // on the primary
		require.NoError(t, err)

		// Starting at the checkpoint, above the standby's head: the page
		// is empty and covers nothing below the cursor; the follower stays.
		f := &pageFollower{pr: rr, cursor: cp, last: cp}
		n, err := f.step(ctx, cp, 100)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Equal(t, cp, f.cursor)

		done := make(chan error, 1)
		go func() {
			_, err := f.step(ctx, from+6, 100) // a batch announces the head
			done <- err
		}()
		waitRetrying(t, rr, r, done)
		require.NoError(t, <-done)
		require.Equal(t, 2, f.read, "exactly the events after the checkpoint")
		require.Equal(t, from+6, f.last)
	})

	t.Run("ReplayPausedPastWaitReadsThePrimary", func(t *testing.T) {
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: 20 * time.Millisecond})
		require.NoError(t, r.WaitReplayed(ctx))
		f := &pageFollower{pr: rr, cursor: head(t, p), last: head(t, p)}
		require.NoError(t, r.PauseReplay(ctx))
		defer func() { require.NoError(t, r.ResumeReplay(ctx)) }()
		for round := 0; round < 3; round++ {
			appendN(t, p, 8)
			sequenceAll(t, p)
			f.upTo(t, head(t, p))
		}
		require.Equal(t, 24, f.read)
		require.Positive(t, rr.Stats().PrimaryReads, "pages the paused standby did not cover came from the primary")
	})

	t.Run("FallbackPastALag", func(t *testing.T) {
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: eventsource.ReplicaWaitMax, FallbackLag: time.Millisecond,
			LagInterval: 10 * time.Millisecond})
		require.NoError(t, r.WaitReplayed(ctx))
		require.False(t, rr.Measure(ctx).FallingBack)
		f := &pageFollower{pr: rr, cursor: head(t, p), last: head(t, p)}
		require.NoError(t, r.PauseReplay(ctx))
		appendN(t, p, 5)
		sequenceAll(t, p)
		var st eventsource.ReadReplicaStats
		pgtest.Eventually(t, time.Minute, func() bool { st = rr.Measure(ctx); return st.FallingBack },
			"the lag passes FallbackLag")
		require.EqualValues(t, 5, st.LagEvents)
		require.Positive(t, st.Lag)
		// With Wait a minute, only the fallback can serve these reads.
		f.upTo(t, head(t, p))
		require.Equal(t, 5, f.read)
		require.Positive(t, rr.Stats().PrimaryReads)

		require.NoError(t, r.ResumeReplay(ctx))
		pgtest.Eventually(t, time.Minute, func() bool { st = rr.Measure(ctx); return !st.FallingBack },
			"the standby catches up and reads go back to it")
		require.Zero(t, st.LagEvents)
		require.Zero(t, st.Lag)
		before := rr.Stats().StandbyReads
		appendN(t, p, 3)
		sequenceAll(t, p)
		f.upTo(t, head(t, p))
		require.Equal(t, 8, f.read)
		require.Greater(t, rr.Stats().StandbyReads, before)
	})

	t.Run("WarnPastWarnLag", func(t *testing.T) {
		var logs syncBuffer
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{WarnLag: time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		require.NoError(t, r.WaitReplayed(ctx))
		rr.Measure(ctx)
		require.NoError(t, r.PauseReplay(ctx))
		appendN(t, p, 3)
		sequenceAll(t, p)
		pgtest.Eventually(t, time.Minute, func() bool { return rr.Measure(ctx).Lag > time.Millisecond }, "the lag passes WarnLag")
		rr.Measure(ctx) // still lagging: no second line
		require.NoError(t, r.ResumeReplay(ctx))
		pgtest.Eventually(t, time.Minute, func() bool { return rr.Measure(ctx).Lag == 0 }, "the standby catches up")
		out := logs.String()
		require.Equal(t, 1, strings.Count(out, `level=WARN msg="kumi: read replica lagging"`), out)
		require.Contains(t, out, "lag_events=3")
		require.Equal(t, 1, strings.Count(out, `level=INFO msg="kumi: read replica caught up"`), out)
	})

	t.Run("BucketLagCountsOnTheStandby", func(t *testing.T) {
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{FallbackLag: time.Millisecond, LagInterval: 10 * time.Millisecond})
		require.NoError(t, r.WaitReplayed(ctx))
		before, _, err := p.BucketLag(ctx, "acct", 0, 1, 0)
		require.NoError(t, err)
		require.NoError(t, r.PauseReplay(ctx))
		defer func() { require.NoError(t, r.ResumeReplay(ctx)) }()
		appendN(t, p, 4)
		sequenceAll(t, p)
		n, _, err := rr.BucketLag(ctx, "acct", 0, 1, 0)
		require.NoError(t, err)
		require.Equal(t, before, n, "counted on the paused standby")
		pgtest.Eventually(t, time.Minute, func() bool { return rr.Measure(ctx).FallingBack }, "the lag passes FallbackLag")
		n, _, err = rr.BucketLag(ctx, "acct", 0, 1, 0)
		require.NoError(t, err)
		require.Equal(t, before+4, n, "counted on the primary while falling back")
	})

	t.Run("RestartedReplica", func(t *testing.T) {
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: 50 * time.Millisecond})
		f := &pageFollower{pr: rr, cursor: head(t, p), last: head(t, p)}
		start := head(t, p)
		appendN(t, p, 6)
		sequenceAll(t, p)
		f.upTo(t, head(t, p))
		require.NoError(t, r.Restart(ctx))
		// Pages while the standby comes back (its pool's old connections
		// died with it): a standby error sends the read to the primary.
		appendN(t, p, 6)
		sequenceAll(t, p)
		f.upTo(t, head(t, p))
		before := rr.Stats().StandbyReads
		appendN(t, p, 6)
		sequenceAll(t, p)
		require.NoError(t, r.WaitReplayed(ctx)) // so that the standby covers the pages however slow the machine
		f.upTo(t, head(t, p))
		require.EqualValues(t, head(t, p)-start, f.read)
		require.Greater(t, rr.Stats().StandbyReads, before, "after the restart, reads are back on the standby")
	})

	t.Run("LiveAppendsPausesAndBuckets", func(t *testing.T) {
		// Appends (one transaction committing behind later ones) and
		// replay pauses interleave with followers of $all and of every
		// bucket of a group of 3, each told the primary's head as a
		// notification would; together they read every event once.
		rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: 30 * time.Millisecond})
		require.NoError(t, p.EnsureConsumerGroupIndex(ctx, 3))
		start := head(t, p)
		all := &pageFollower{pr: rr, cursor: start, last: start}
		buckets := make([]*bucketFollower, 3)
		for b := range buckets {
			buckets[b] = &bucketFollower{pr: rr, bucket: b, cursor: start, versions: map[string]int64{}}
		}
		for round := 0; round < 4; round++ {
			if round%2 == 1 {
				require.NoError(t, r.PauseReplay(ctx))
			}
			tx, err := p.Pool().Begin(ctx)
			require.NoError(t, err)
			_, err = p.AppendTx(ctx, tx, fmt.Sprintf("late-%d", round), eventsource.Any, []eventsource.EventData{ev("Late", `{}`)})
			require.NoError(t, err)
			for i := 0; i < 15; i++ {
				mustAppend(t, p, fmt.Sprintf("acct-%d", i%5), ev("Deposited", `{}`))
				if i%5 == 4 {
					sequenceAll(t, p)
					known := head(t, p)
					_, err := all.step(ctx, known, 4)
					require.NoError(t, err)
					for _, b := range buckets {
						require.NoError(t, b.step(ctx, known, 3))
					}
				}
			}
			require.NoError(t, tx.Commit(ctx))
			sequenceAll(t, p)
			if round%2 == 1 {
				require.NoError(t, r.ResumeReplay(ctx))
			}
		}
		end := head(t, p)
		all.upTo(t, end)
		require.EqualValues(t, end-start, all.read)
		total := 0
		for _, b := range buckets {
			for b.cursor < end {
				require.NoError(t, b.step(ctx, end, 3))
			}
			total += len(b.positions)
		}
		acct, err := p.ReadCategory(ctx, "acct", start, 10_000)
		require.NoError(t, err)
		require.Equal(t, len(acct), total, "the buckets together read every acct event once")
	})
}

// bucketFollower is pageFollower for one bucket of a group of 3 over
// category acct: its positions rise, each stream's versions follow one
// another, and the rule moves its cursor to known after a page that is
// not full.
type bucketFollower struct {
	pr        eventsource.PageReader
	bucket    int
	cursor    int64
	versions  map[string]int64
	positions []int64
}

func (b *bucketFollower) step(ctx context.Context, known int64, limit int) error {
	events, err := b.pr.ReadBucketPage(ctx, "acct", b.bucket, 3, eventsource.Page{After: b.cursor, Known: known, Limit: limit})
	if err != nil {
		return err
	}
	for _, e := range events {
		if e.Position <= b.cursor {
			return fmt.Errorf("bucket %d: position %d after %d", b.bucket, e.Position, b.cursor)
		}
		if last, ok := b.versions[e.Stream]; ok && e.Version != last+1 {
			return fmt.Errorf("bucket %d: %s: version %d after %d", b.bucket, e.Stream, e.Version, last)
		}
		b.versions[e.Stream] = e.Version
		b.cursor = e.Position
		b.positions = append(b.positions, e.Position)
	}
	if len(events) < limit {
		b.cursor = max(b.cursor, known)
	}
	return nil
}

// syncBuffer is a bytes.Buffer safe for a logger and the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReadReplicaRefusesAPoolThatIsNotAStandby: a read pool on another
// database with the same schema, or on another cluster, is refused with a
// typed error naming the mismatch (it delivered another database's events
// as the store's, and checkpointed past the real ones); the primary
// itself is accepted.
func TestReadReplicaRefusesAPoolThatIsNotAStandby(t *testing.T) {
	ctx := context.Background()
	p, srv := localStore(t)
	appendN(t, p, 5)
	sequenceAll(t, p)

	t.Run("AnotherDatabase", func(t *testing.T) {
		name := pgtest.NewSchema(t) // a fresh name, for a database
		_, err := p.Pool().Exec(ctx, "CREATE DATABASE "+name)
		require.NoError(t, err)
		t.Cleanup(func() {
			_, _ = pgtest.PoolOn(t, srv.URL, 1).Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		})
		other := pgtest.PoolOn(t, strings.Replace(srv.URL, "/postgres?", "/"+name+"?", 1), 5)
		elsewhere, err := eventsource.New(other, eventsource.Config{Schema: p.Schema()})
		require.NoError(t, err)
		require.NoError(t, elsewhere.Migrate(ctx))
		appendN(t, elsewhere, 20)
		sequenceAll(t, elsewhere)

		rr, err := eventsource.NewReadReplica(p, other, eventsource.ReadReplicaOptions{})
		require.NoError(t, err)
		_, err = rr.ReadAllPage(ctx, eventsource.Page{Known: 5, Limit: 100})
		var m *kumierr.ConfigError
		require.ErrorAs(t, err, &m, "a read is refused")
		require.Equal(t, "eventsource standby", m.Field)
		require.Contains(t, m.Reason, `its database is "`+name+`", the primary's "postgres"`)
		_, err = rr.HeadPosition(ctx)
		require.ErrorIs(t, err, eventsource.ErrReplicaMismatch)
		require.ErrorIs(t, rr.Start(ctx), eventsource.ErrReplicaMismatch, "Start refuses it")
	})

	t.Run("AnotherCluster", func(t *testing.T) {
		other, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 20})
		require.NoError(t, err)
		t.Cleanup(other.Stop)
		rr, err := eventsource.NewReadReplica(p, pgtest.PoolOn(t, other.URL, 2), eventsource.ReadReplicaOptions{})
		require.NoError(t, err)
		err = rr.Check(ctx)
		require.ErrorIs(t, err, eventsource.ErrReplicaMismatch)
		var m *kumierr.ConfigError
		require.ErrorAs(t, err, &m)
		require.Contains(t, m.Reason, "its system identifier is ")
	})

	t.Run("ThePrimaryItselfIsAccepted", func(t *testing.T) {
		rr, err := eventsource.NewReadReplica(p, p.Pool(), eventsource.ReadReplicaOptions{})
		require.NoError(t, err)
		require.NoError(t, rr.Check(ctx))
		events, err := rr.ReadAllPage(ctx, eventsource.Page{Known: 5, Limit: 100})
		require.NoError(t, err)
		require.Len(t, events, 5)
	})
}

// TestReadReplicaFallsBackWithinTheCallersTimeout: with replay paused and
// Wait at its most, a read whose caller has a timeout shorter than Wait
// falls back to the primary within it (it waited out the caller's
// timeout and failed: a catch-up never completed).
func TestReadReplicaFallsBackWithinTheCallersTimeout(t *testing.T) {
	ctx := context.Background()
	p, srv := localStore(t)
	r := pgtest.NewReplica(t, srv)
	rr := newReadReplica(t, p, r, eventsource.ReadReplicaOptions{Wait: eventsource.ReplicaWaitMax})
	require.NoError(t, rr.Check(ctx))
	require.NoError(t, r.PauseReplay(ctx))
	defer func() { require.NoError(t, r.ResumeReplay(ctx)) }()
	appendN(t, p, 4)
	sequenceAll(t, p)

	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	events, err := rr.ReadAllPage(rctx, eventsource.Page{Known: 4, Limit: 100})
	require.NoError(t, err, "the read fell back to the primary within its caller's timeout")
	require.Len(t, events, 4)
	require.EqualValues(t, 1, rr.Stats().PrimaryReads)
}
