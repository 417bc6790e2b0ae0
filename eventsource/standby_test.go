package eventsource_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// The tests of docs/design/eventsource.md, "Reading from a hot standby": reads of
// position > cursor on a real streaming standby of the test server.

// onStandby returns a store over a pool of its own on standby r, reading
// the schema of primary, closed when the test ends.
func onStandby(t *testing.T, r *pgtest.Replica, primary *eventsource.Store) *eventsource.Store {
	t.Helper()
	s, err := eventsource.New(pgtest.PoolOn(t, r.URL, 10), eventsource.Config{Schema: primary.Schema()})
	require.NoError(t, err)
	return s
}

// cursorReader follows $all from a cursor the way a subscription does: it
// advances only past what it read, and checks every page against the
// argument — it starts right after the cursor, has no gap, and keeps each
// stream's versions in order.
type cursorReader struct {
	s        *eventsource.Store
	cursor   int64
	versions map[string]int64
	read     int
}

func newCursorReader(s *eventsource.Store) *cursorReader {
	return &cursorReader{s: s, versions: map[string]int64{}}
}

// page reads one page of at most limit events and returns how many it
// got, or an error naming the first broken rule.
func (c *cursorReader) page(ctx context.Context, limit int) (int, error) {
	events, err := c.s.ReadAll(ctx, c.cursor, limit)
	if err != nil {
		return 0, err
	}
	for _, e := range events {
		if e.Position != c.cursor+1 {
			return 0, fmt.Errorf("after position %d the standby returned %d: a gap", c.cursor, e.Position)
		}
		if last, ok := c.versions[e.Stream]; ok && e.Version != last+1 {
			return 0, fmt.Errorf("%s: version %d after %d", e.Stream, e.Version, last)
		}
		c.versions[e.Stream] = e.Version
		c.cursor = e.Position
		c.read++
	}
	return len(events), nil
}

// until reads pages until the cursor reaches target, retrying an empty
// page with a backoff (a standby behind the target will catch up), for at
// most a minute.
func (c *cursorReader) until(t *testing.T, target int64) {
	t.Helper()
	var err error
	pgtest.Eventually(t, time.Minute, func() bool {
		for err == nil && c.cursor < target {
			var n int
			if n, err = c.page(context.Background(), 7); n == 0 {
				break
			}
		}
		return err != nil || c.cursor >= target
	}, "the standby's reads reach position %d (cursor %d)", target, c.cursor)
	require.NoError(t, err)
	require.Equal(t, target, c.cursor)
}

func appendN(t *testing.T, s *eventsource.Store, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		mustAppend(t, s, fmt.Sprintf("acct-%d", i%3), ev("Deposited", fmt.Sprintf(`{"i":%d}`, i)))
	}
}

// localStore returns a migrated store in a fresh schema on a server a
// standby can be made of (pgtest.LocalServer), and that server.
func localStore(t *testing.T) (*eventsource.Store, *pgtest.Server) {
	t.Helper()
	srv := pgtest.LocalServer(t)
	s, err := eventsource.New(pgtest.PoolOn(t, srv.URL, 10), eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s, srv
}

func head(t *testing.T, s *eventsource.Store) int64 {
	t.Helper()
	h, err := s.HeadPosition(context.Background())
	require.NoError(t, err)
	return h
}

// TestStandby: one standby for the points of the argument that leave it
// a standby; they run in order, since they pause its replay.
func TestStandby(t *testing.T) {
	ctx := context.Background()
	p, srv := localStore(t)
	r := pgtest.NewReplica(t, srv)
	s := onStandby(t, r, p)

	t.Run("ShowsAPrefixOfPositions", func(t *testing.T) {
		// Appends (one committing late, behind later ones), sequencer
		// steps and replay pauses interleave with a reader on the
		// standby; every page it gets continues its cursor with no gap.
		reader := newCursorReader(s)
		done := make(chan error, 1)
		go func() {
			done <- func() error {
				for round := 0; round < 6; round++ {
					if round%2 == 1 {
						if err := r.PauseReplay(ctx); err != nil {
							return err
						}
					}
					tx, err := p.Pool().Begin(ctx)
					if err != nil {
						return err
					}
					if _, err := p.AppendTx(ctx, tx, fmt.Sprintf("late-%d", round), eventsource.Any,
						[]eventsource.EventData{ev("Late", `{}`)}); err != nil {
						_ = tx.Rollback(ctx)
						return err
					}
					for i := 0; i < 20; i++ {
						if _, err := p.Append(ctx, fmt.Sprintf("acct-%d", i%7), eventsource.Any,
							[]eventsource.EventData{ev("Deposited", `{}`), ev("Noted", `{}`)}); err != nil {
							_ = tx.Rollback(ctx)
							return err
						}
						if i%5 == 4 {
							if _, err := p.Sequence(ctx); err != nil {
								_ = tx.Rollback(ctx)
								return err
							}
						}
					}
					if err := tx.Commit(ctx); err != nil {
						return err
					}
					if _, err := p.Sequence(ctx); err != nil {
						return err
					}
					if round%2 == 1 {
						standbyHead, err := s.HeadPosition(ctx)
						if err != nil {
							return err
						}
						primaryHead, err := p.HeadPosition(ctx)
						if err != nil {
							return err
						}
						if standbyHead >= primaryHead {
							return fmt.Errorf("paused standby at head %d, primary at %d: the pause showed nothing", standbyHead, primaryHead)
						}
						if err := r.ResumeReplay(ctx); err != nil {
							return err
						}
					}
				}
				return nil
			}()
		}()
		var writeErr error
		writing := true
		for writing {
			n, err := reader.page(ctx, 7)
			require.NoError(t, err)
			if n > 0 {
				continue
			}
			select { // nothing new on the standby yet: wait a little, or for the writer's end
			case writeErr = <-done:
				writing = false
			case <-time.After(5 * time.Millisecond):
			}
		}
		require.NoError(t, writeErr)
		total := head(t, p)
		require.EqualValues(t, 6*41, total, "every committed event has a position")
		reader.until(t, total)
		require.Equal(t, 6*41, reader.read, "each event read once")
	})

	t.Run("ReadBehindTheNotifiedHead", func(t *testing.T) {
		reader := newCursorReader(s)
		reader.until(t, head(t, p))
		require.NoError(t, r.PauseReplay(ctx))
		appendN(t, p, 9)
		sequenceAll(t, p)
		announced := head(t, p) // what a notification (or the safety poll) carries
		before := reader.cursor
		n, err := reader.page(ctx, 100)
		require.NoError(t, err)
		require.Zero(t, n, "the paused standby shows none of the new events")
		require.Equal(t, before, reader.cursor, "and the cursor does not move to the announced head")
		require.Less(t, reader.cursor, announced)

		// No new append, so no new notification: the reader, below the
		// head it was told of, retries until replay brings the rest.
		require.NoError(t, r.ResumeReplay(ctx))
		reader.until(t, announced)
	})

	t.Run("ReadFromACheckpointAheadOfReplay", func(t *testing.T) {
		require.NoError(t, r.WaitReplayed(ctx))
		from := head(t, p)
		require.NoError(t, r.PauseReplay(ctx))
		appendN(t, p, 6)
		sequenceAll(t, p)
		_, err := p.SaveCheckpoint(ctx, "standby", 0, from+4, nil)
		require.NoError(t, err)

		onStandbyCP, err := s.Checkpoint(ctx, "standby", 0)
		require.NoError(t, err)
		require.Zero(t, onStandbyCP, "the standby's copy of the checkpoint is older: checkpoints are read on the primary")
		cp, err := p.Checkpoint(ctx, "standby", 0)
		require.NoError(t, err)
		require.Equal(t, from+4, cp)

		reader := newCursorReader(s)
		reader.cursor = cp
		n, err := reader.page(ctx, 100)
		require.NoError(t, err)
		require.Zero(t, n, "a read past the standby's head returns nothing, not later events")
		require.NoError(t, r.ResumeReplay(ctx))
		reader.until(t, from+6)
		require.Equal(t, 2, reader.read, "exactly the events after the checkpoint")
	})

	t.Run("RestartLosesNothing", func(t *testing.T) {
		reader := newCursorReader(s)
		reader.until(t, head(t, p))
		require.NoError(t, r.Restart(ctx))
		after := onStandby(t, r, p) // the old pool's connections died with the server
		reader.s = after
		appendN(t, p, 8)
		sequenceAll(t, p)
		reader.until(t, head(t, p))
		require.EqualValues(t, head(t, p), reader.read)
	})
}

// TestStandbyPromotedContinuesDensely: a standby cut off from its primary
// and promoted, as in a failover that loses the primary's latest commits,
// hands out positions after its own head. A cursor taken from it is never
// above that head, so it reads the new events with no gap; a cursor kept
// from the old primary is above it and would skip them — why readers must
// restart from the new primary's checkpoints after a promotion.
func TestStandbyPromotedContinuesDensely(t *testing.T) {
	ctx := context.Background()
	p, srv := localStore(t)
	r := pgtest.NewReplica(t, srv)
	appendN(t, p, 5)
	sequenceAll(t, p)
	require.NoError(t, r.WaitReplayed(ctx))
	s := onStandby(t, r, p)
	reader := newCursorReader(s)
	reader.until(t, 5)

	require.NoError(t, r.Detach(ctx))
	appendN(t, p, 5) // committed on the old primary only
	sequenceAll(t, p)
	oldPrimaryCursor := head(t, p)
	require.EqualValues(t, 10, oldPrimaryCursor)

	require.NoError(t, r.Promote(ctx))
	promoted := onStandby(t, r, p)
	require.EqualValues(t, 5, head(t, promoted), "the promoted standby's head is what it had replayed")
	appendN(t, promoted, 4)
	sequenceAll(t, promoted)
	require.EqualValues(t, 9, head(t, promoted), "new positions follow its head, densely")

	reader.s = promoted
	reader.until(t, 9)
	require.Equal(t, 9, reader.read, "the standby's reader reads the new events with no gap")

	stale, err := promoted.ReadAll(ctx, oldPrimaryCursor, 100)
	require.NoError(t, err)
	require.Empty(t, stale, "a cursor kept from the old primary is past every new event: it would skip them")

	// What a reader can tell the failover by: the timeline.
	timeline := func(s *eventsource.Store) string {
		var tl string
		require.NoError(t, s.Pool().QueryRow(ctx, "SELECT left(pg_walfile_name(pg_current_wal_lsn()), 8)").Scan(&tl))
		return tl
	}
	require.NotEqual(t, timeline(p), timeline(promoted), "promotion starts a new timeline")
}
