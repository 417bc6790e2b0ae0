package eventsource_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// The tests of docs/design/eventsource.md, "Failover": a primary of the test's
// own and a real streaming standby, cut off before the primary's last
// commits and promoted after the primary dies, reached the way a worker
// given a multi-host URL reaches its database.

// failover is a primary, a standby of it, and a URL on both that reaches
// whichever of them is read-write (target_session_attrs=read-write).
type failover struct {
	primary *pgtest.Server
	standby *pgtest.Replica
	url     string
	schema  string
}

func newFailover(t *testing.T) *failover {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 100})
	require.NoError(t, err)
	t.Cleanup(srv.Stop)
	r := pgtest.NewReplica(t, srv)
	return &failover{primary: srv, standby: r, schema: "kumi",
		url: fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write",
			srv.Port(), r.Port())}
}

// store returns a migrated store over a pool of its own on f's URL.
func (f *failover) store(t *testing.T, logger *slog.Logger) *eventsource.Store {
	t.Helper()
	s, err := eventsource.New(pgtest.PoolOn(t, f.url, 10), eventsource.Config{Schema: f.schema, Logger: logger})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}

// detach waits until the standby has replayed everything committed, then
// cuts it off: what the primary commits from now on, the standby never has.
func (f *failover) detach(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, f.standby.WaitReplayed(ctx))
	require.NoError(t, f.standby.Detach(ctx))
}

// promote kills the primary and promotes the standby; the pools of stores
// drop their connections (a worker's pool finds them dead at first use).
func (f *failover) promote(t *testing.T, stores ...*eventsource.Store) {
	t.Helper()
	f.primary.Stop()
	require.NoError(t, f.standby.Promote(context.Background()))
	for _, s := range stores {
		s.Pool().Reset()
	}
}

// TestFailover: 10 events reach the standby; 60 more are sequenced on the
// primary only; the standby is promoted with a head of 10, and the
// positions 11 to 70 are handed out again. What kumi's event store does
// about it, in order.
func TestFailover(t *testing.T) {
	ctx := context.Background()
	f := newFailover(t)
	var logs syncBuffer
	s := f.store(t, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})))
	appendN(t, s, 10)
	sequenceAll(t, s)
	before, err := s.CheckServer(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, before.Identity.Timeline)
	require.NotZero(t, before.Identity.System)

	// A store that sequenced on the old primary, to find the change by
	// its own step.
	q := f.store(t, nil)
	sequenceAll(t, q)

	// The notifier's own store: it finds the change by itself.
	ns := f.store(t, nil)
	n, err := ns.NewNotifier(eventsource.NotifierOptions{PollInterval: 20 * time.Millisecond,
		ReconnectMin: 20 * time.Millisecond, ReconnectMax: 100 * time.Millisecond})
	require.NoError(t, err)
	startNotifier(t, n)
	l, err := n.Listen(ns.NotifyChannel())
	require.NoError(t, err)
	defer l.Close()

	// A store that looked at the old primary only: its fence finds the
	// change by itself.
	fs := f.store(t, nil)
	_, err = fs.CheckServer(ctx)
	require.NoError(t, err)

	f.detach(t)
	appendN(t, s, 60) // more seqs than the sequence logs ahead (32)
	sequenceAll(t, s) // the store's watermark candidate now covers them
	sequenceAll(t, q) // q saw head 70
	require.EqualValues(t, 70, head(t, s))
	pgtest.Eventually(t, time.Minute, func() bool { return l.Latest() == 70 }, "the notifier saw head 70")
	var oldXid, oldLastSeq int64
	require.NoError(t, s.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT pg_current_xact_id()::text::bigint,
		pg_sequence_last_value(pg_get_serial_sequence('%s.appends', 'seq'))`, s.QuotedSchema())).Scan(&oldXid, &oldLastSeq))

	f.promote(t, s, ns, q, fs)
	require.EqualValues(t, 10, head(t, s), "the promoted standby's head is what it had replayed")

	t.Run("CheckServerFindsTheNewTimeline", func(t *testing.T) {
		after, err := s.CheckServer(ctx)
		require.NoError(t, err)
		require.Equal(t, before.Epoch+1, after.Epoch)
		require.Equal(t, eventsource.ServerChange{Reason: eventsource.ServerChangeTimeline,
			Old: before.Identity, New: eventsource.ServerIdentity{System: before.Identity.System, Timeline: 2},
			HeadBefore: 70, HeadAfter: 10, At: after.Last.At}, *after.Last)
		select {
		case <-before.Changed:
		default:
			require.Fail(t, "the epoch before the change is told of it")
		}
		again, err := s.CheckServer(ctx)
		require.NoError(t, err)
		require.Equal(t, after.Epoch, again.Epoch, "one change, found once")
		require.Equal(t, 1, strings.Count(logs.String(), "the event store's server changed"), logs.String())
		require.Contains(t, logs.String(), "old_timeline=1 new_timeline=2 head_before=70 head_after=10")
	})

	t.Run("ACheckpointAboveTheNewHeadIsRefused", func(t *testing.T) {
		_, err := s.SaveCheckpoint(ctx, "sub", 0, 30, nil)
		require.ErrorIs(t, err, eventsource.ErrCheckpointAboveHead)
		stored, err := s.SaveCheckpoint(ctx, "sub", 0, 10, nil)
		require.NoError(t, err)
		require.EqualValues(t, 10, stored)
	})

	t.Run("AServerFenceRefusesAWriteOfTheOldServer", func(t *testing.T) {
		_, err := fs.SaveCheckpoint(ctx, "fenced", 0, 5, fs.ServerFence(0, nil))
		var changed *eventsource.ServerChangedError
		require.ErrorAs(t, err, &changed)
		require.ErrorIs(t, err, eventsource.ErrServerChanged)
		require.Equal(t, eventsource.ServerChangedError{Epoch: 0, Now: 1,
			Server: eventsource.ServerIdentity{System: before.Identity.System, Timeline: 2}}, *changed)
		require.EqualValues(t, 1, fs.Server().Epoch, "the fence's look found the change")
		cp, err := fs.Checkpoint(ctx, "fenced", 0)
		require.NoError(t, err)
		require.Zero(t, cp, "nothing was written")
		stored, err := fs.SaveCheckpoint(ctx, "fenced", 0, 5, fs.ServerFence(1, eventsource.FenceFunc(
			func(context.Context, pgx.Tx) error { return nil })))
		require.NoError(t, err, "a write of the new epoch lands")
		require.EqualValues(t, 5, stored)
	})

	t.Run("TheNotifierForgetsTheOldHead", func(t *testing.T) {
		pgtest.Eventually(t, time.Minute, func() bool { return n.Stats().Connects >= 2 && l.Latest() == 10 },
			"the notifier, reconnected to the new primary, shows its head 10 (latest %d)", l.Latest())
		require.EqualValues(t, 1, ns.Server().Epoch, "the notifier's reconnection found the change")
		require.Equal(t, eventsource.ServerChangeTimeline, ns.Server().Last.Reason)
	})

	// An append in flight on the new primary, with a seq the old primary's
	// watermark candidate covers and an xid above the candidate's, once
	// other appends have drawn seqs past it: a candidate kept across the
	// failover would raise the watermark above it, and it would never get
	// a position.
	t.Run("NoAppendIsStrandedBelowTheWatermark", func(t *testing.T) {
		conn, err := pgx.Connect(ctx, f.standby.URL)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var xid int64
		for xid <= oldXid {
			require.NoError(t, conn.QueryRow(ctx, "SELECT pg_current_xact_id()::text::bigint").Scan(&xid))
		}
		tx, err := s.Pool().Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = s.AppendTx(ctx, tx, "held-1", eventsource.Any, []eventsource.EventData{ev("Held", `{}`)})
		require.NoError(t, err)
		var heldSeq int64
		require.NoError(t, tx.QueryRow(ctx, "SELECT seq FROM "+s.QuotedSchema()+".appends WHERE stream_name = 'held-1'").Scan(&heldSeq))
		require.LessOrEqual(t, heldSeq, oldLastSeq, "the in-flight append's seq is one the old candidate covers")
		appendN(t, s, 60)
		sequenceAll(t, s)
		require.NoError(t, tx.Commit(ctx))
		sequenceAll(t, s)
		held, err := s.ReadStream(ctx, "held-1", 0, 10)
		require.NoError(t, err)
		require.Len(t, held, 1)
		require.NotZero(t, held[0].Position, "the append in flight across the step got a position")
		require.EqualValues(t, 71, head(t, s))
	})

	t.Run("ASequencerStepFindsTheChangeByItself", func(t *testing.T) {
		_, err := q.Sequence(ctx)
		require.NoError(t, err)
		e := q.Server()
		require.EqualValues(t, 1, e.Epoch)
		require.Equal(t, eventsource.ServerChangeTimeline, e.Last.Reason)
		require.EqualValues(t, 70, e.Last.HeadBefore)
		require.EqualValues(t, 71, e.Last.HeadAfter)
	})

	t.Run("TheFailoverIsRecordedOnceForEveryone", func(t *testing.T) {
		// s (CheckServer) and q (a sequencer step) found it; the
		// notifier's store found it too, without a head, and records it
		// at its next look.
		_, err := ns.CheckServer(ctx)
		require.NoError(t, err)
		fresh := f.store(t, nil) // a process started after the failover finds nothing, and reads the record
		rec, err := fresh.ServerChanges(ctx, 0)
		require.NoError(t, err)
		require.Len(t, rec, 1, "one failover, one entry: %+v", rec)
		c := rec[0]
		require.Equal(t, eventsource.ServerChangeTimeline, c.Reason)
		require.Equal(t, before.Identity, c.Old)
		require.EqualValues(t, 2, c.New.Timeline)
		require.EqualValues(t, 70, c.HeadBefore, "the highest position any finder had seen")
		require.EqualValues(t, 10, c.HeadAfter, "the lowest head any finder read on the new server")
		require.True(t, c.Reused(), "positions 11 to 70 were handed out again")
		require.GreaterOrEqual(t, c.Reports, 3)
		require.NotEmpty(t, c.FoundBy)
		require.False(t, c.At.IsZero())
		_, err = fresh.ServerChanges(ctx, -1)
		require.ErrorContains(t, err, "limit")
	})
}

// TestServerHeadBelowASeenPosition: on the same server, a head below a
// position the process has seen is a change too (a restore that kept the
// timeline); the head a look reads is compared only with what was seen
// before it began.
func TestServerHeadBelowASeenPosition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStoreWithHead(t, 5)
	first, err := s.CheckServer(ctx)
	require.NoError(t, err)
	require.Zero(t, first.Epoch, "the first look is no change")
	s.SawPosition(5)
	same, err := s.CheckServer(ctx)
	require.NoError(t, err)
	require.Zero(t, same.Epoch)

	s.SawPosition(9) // as a reader of another server's positions would
	after, err := s.CheckServer(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, after.Epoch)
	require.Equal(t, eventsource.ServerChange{Reason: eventsource.ServerChangeHead, Old: first.Identity, New: first.Identity,
		HeadBefore: 9, HeadAfter: 5, At: after.Last.At}, *after.Last)
}

// TestSequencerCommitWaitsForTheSynchronousStandby: with
// synchronous_standby_names set and the session's synchronous_commit off,
// the sequencer's commit still waits for the synchronous standby, so the
// positions it hands out survive a failover to it (it used "local", which
// waits for the primary's disk only). The standby is cut off, so the
// commit waits until synchronous replication is turned off.
func TestSequencerCommitWaitsForTheSynchronousStandby(t *testing.T) {
	ctx := context.Background()
	f := newFailover(t)
	s := f.store(t, nil)
	appendN(t, s, 3)
	sequenceAll(t, s)
	f.detach(t)
	admin, err := pgx.Connect(ctx, f.primary.URL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	syncStandby := func(names string) {
		t.Helper()
		_, err := admin.Exec(ctx, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names = '%s'", names))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, "SELECT pg_reload_conf()")
		require.NoError(t, err)
		pgtest.Eventually(t, time.Minute, func() bool {
			var got string
			return s.Pool().QueryRow(ctx, "SELECT current_setting('synchronous_standby_names')").Scan(&got) == nil && got == names
		}, "synchronous_standby_names is %q", names)
	}
	syncStandby("*")
	// Backends read the setting at once, but commits wait for a standby
	// only once the checkpointer has applied it: until a probe's commit
	// waits, probe again.
	probe, err := pgx.Connect(ctx, f.primary.URL+"&synchronous_commit=on")
	require.NoError(t, err)
	defer probe.Close(ctx)
	probePID := probe.PgConn().PID()
	probed := make(chan error, 1)
	probeOnce := func() {
		go func() {
			_, err := probe.Exec(ctx, "SELECT pg_logical_emit_message(true, 'probe', '')")
			probed <- err
		}()
	}
	probeOnce()
	syncRepWaiters := func() int {
		var n int
		require.NoError(t, admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid <> $1",
			probePID).Scan(&n))
		return n
	}
	pgtest.Eventually(t, time.Minute, func() bool {
		select {
		case err := <-probed:
			require.NoError(t, err)
			probeOnce()
			return false
		default:
		}
		var waiting bool
		require.NoError(t, admin.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND pid = $1)",
			probePID).Scan(&waiting))
		return waiting
	}, "a probe's commit waits for the synchronous standby")
	var commit string
	require.NoError(t, s.Pool().QueryRow(ctx, "SHOW synchronous_commit").Scan(&commit))
	require.Equal(t, "off", commit, "the session default the sequencer overrides")
	appendN(t, s, 2) // the appends' commits do not wait: synchronous_commit is off

	done := make(chan error, 1)
	go func() {
		_, err := s.Sequence(ctx)
		done <- err
	}()
	pgtest.Eventually(t, time.Minute, func() bool {
		select {
		case err := <-done:
			require.Failf(t, "the sequencer's commit did not wait for the synchronous standby", "err %v", err)
		default:
		}
		return syncRepWaiters() > 0
	}, "the sequencer's commit waits for the synchronous standby")
	require.EqualValues(t, 3, head(t, s), "its positions are not visible while it waits")
	syncStandby("")
	require.NoError(t, <-done)
	require.NoError(t, <-probed)
	require.EqualValues(t, 5, head(t, s))
}

// TestSequencerRescuesAnAppendStrandedBelowTheWatermark: a committed
// append below the search watermark without a position (what a watermark
// candidate kept across a failover left: TestFailover) is never reached
// by a step's search; the sequencer's look below the watermark finds it,
// lowers the watermark, and the next step numbers it.
func TestSequencerRescuesAnAppendStrandedBelowTheWatermark(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStoreWithHead(t, 3)
	mustAppend(t, s, "stranded-1", ev("Stranded", `{}`))
	_, err := s.Pool().Exec(ctx, fmt.Sprintf("UPDATE %[1]s.sequencer SET low_seq = (SELECT max(seq) FROM %[1]s.appends)", s.QuotedSchema()))
	require.NoError(t, err)
	n, err := s.Sequence(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "a step's search starts above the watermark: it never finds the append")

	logs := &logCounter{}
	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{Logger: slog.New(logs)})
	startSequencer(t, q)
	pgtest.Eventually(t, 30*time.Second, func() bool { return head(t, s) == 4 }, "the stranded append got a position")
	require.EqualValues(t, 1, q.Stats().Stranded)
	require.Equal(t, 1, logs.count(slog.LevelWarn))
	logs.mu.Lock()
	require.Contains(t, logs.warns[0], "below its watermark without a position")
	logs.mu.Unlock()
	got, err := s.ReadStream(ctx, "stranded-1", 0, 1)
	require.NoError(t, err)
	require.EqualValues(t, 4, got[0].Position)
}

// TestSequencerResumesAfterAPromotion: a Sequencer running across the
// primary's death and the standby's promotion, on a multi-host URL, goes
// on sequencing on the new primary (its connection retries are capped at
// SequencerReconnectMax). It logs how long after the promotion the first
// append made then got its position.
func TestSequencerResumesAfterAPromotion(t *testing.T) {
	ctx := context.Background()
	f := newFailover(t)
	s := f.store(t, nil)
	q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
	startSequencer(t, q)
	appendN(t, s, 5)
	pgtest.Eventually(t, time.Minute, func() bool { return head(t, s) == 5 }, "sequenced on the primary")
	f.detach(t)
	f.primary.Stop()
	require.NoError(t, f.standby.Promote(ctx))
	promoted := time.Now()
	pgtest.Eventually(t, time.Minute, func() bool {
		_, err := s.Append(ctx, "after-1", eventsource.Any, []eventsource.EventData{ev("After", `{}`)})
		return err == nil
	}, "an append on the new primary")
	appended := time.Since(promoted)
	var sequenced time.Duration
	pgtest.Eventually(t, time.Minute, func() bool {
		h, err := s.HeadPosition(ctx)
		sequenced = time.Since(promoted)
		return err == nil && h == 6
	}, "the append on the new primary got position 6")
	t.Logf("after the promotion: appended in %v, sequenced in %v", appended.Round(time.Millisecond), sequenced.Round(time.Millisecond))
	require.EqualValues(t, 1, s.Server().Epoch, "the sequencer found the new timeline")
}
