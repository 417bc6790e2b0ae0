package eventsource_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// The no-skip test: many appenders commit and roll back out of order while
// two sequencers (two "processes") hand out positions and two readers
// follow the global order and one category from their cursors. Every
// committed event must reach each reader exactly once, in per-stream
// order, and no rolled-back one may.
const (
	noSkipAppenders  = 10
	noSkipTarget     = 30_000 // committed events, about
	noSkipStreams    = 300
	noSkipRollbackPc = 20 // percent of transactions rolled back
)

type committedEvent struct {
	stream  string
	version int64
}

func TestNoSkippedEvents(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	schema := pgtest.NewSchema(t)
	// Two stores on two pools play two processes, each with a sequencer.
	s1, err := eventsource.New(pgtest.NewPool(t, noSkipAppenders+4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, s1.Migrate(ctx))
	s2, err := eventsource.New(pgtest.NewPool(t, 4), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	for _, s := range []*eventsource.Store{s1, s2} {
		q := eventsource.NewSequencer(s, eventsource.SequencerOptions{MinInterval: 2 * time.Millisecond, MaxInterval: 10 * time.Millisecond})
		startSequencer(t, q)
	}
	notifier, err := s2.NewNotifier(eventsource.NotifierOptions{PollInterval: 20 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, notifier.Start(ctx))
	defer func() { require.NoError(t, notifier.Stop(context.Background())) }()
	wake, err := notifier.Listen(s2.NotifyChannel())
	require.NoError(t, err)
	defer wake.Close()

	// Readers start first and run throughout.
	readCtx, stopReaders := context.WithCancel(ctx)
	defer stopReaders()
	all := newFollower("$all")
	alpha := newFollower("alpha")
	var readers sync.WaitGroup
	readers.Add(2)
	go func() {
		defer readers.Done()
		all.run(readCtx, wake.C(), func(after int64) ([]eventsource.RecordedEvent, error) {
			return s2.ReadAll(readCtx, after, 300)
		})
	}()
	go func() {
		defer readers.Done()
		alpha.run(readCtx, nil, func(after int64) ([]eventsource.RecordedEvent, error) {
			return s2.ReadCategory(readCtx, "alpha", after, 200)
		})
	}()

	// Appenders: explicit transactions of one to three appends to
	// distinct streams (taken in name order, so that two transactions
	// never deadlock), random delays inside, some rolled back.
	var mu sync.Mutex
	committed := map[uuid.UUID]committedEvent{}
	rolledBack := map[uuid.UUID]bool{}
	var total atomic.Int64
	var appenders sync.WaitGroup
	start := time.Now()
	for a := range noSkipAppenders {
		appenders.Add(1)
		go func() {
			defer appenders.Done()
			rng := rand.New(rand.NewPCG(uint64(a), uint64(time.Now().UnixNano())))
			for total.Load() < noSkipTarget && ctx.Err() == nil {
				got, rollback, err := appendTx(ctx, s1, rng)
				if err != nil {
					t.Errorf("appender %d: %v", a, err)
					return
				}
				mu.Lock()
				for id, e := range got {
					if rollback {
						rolledBack[id] = true
					} else {
						committed[id] = e
					}
				}
				mu.Unlock()
				if !rollback {
					total.Add(int64(len(got)))
				}
			}
		}()
	}
	appenders.Wait()
	require.False(t, t.Failed())
	t.Logf("%d events committed, %d rolled back in %v", len(committed), len(rolledBack), time.Since(start))
	require.GreaterOrEqual(t, len(committed), noSkipTarget)
	require.NotEmpty(t, rolledBack)

	wantAlpha := 0
	for _, e := range committed {
		if strings.HasPrefix(e.stream, "alpha-") {
			wantAlpha++
		}
	}
	// Wait until everything is sequenced and each reader's cursor is at
	// the last position of what it follows; then compare.
	var head, alphaHead int64
	pgtest.Eventually(t, 30*time.Second, func() bool {
		var pending int
		err := s1.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT last_position FROM %[1]s.sequencer),
			(SELECT coalesce(max(last_position), 0) FROM %[1]s.appends WHERE category = 'alpha'),
			(SELECT count(*) FROM %[1]s.appends WHERE last_position IS NULL)`, s1.QuotedSchema())).Scan(&head, &alphaHead, &pending)
		if err != nil {
			t.Logf("waiting: %v", err)
		}
		return err == nil && pending == 0 && all.at() == head && alpha.at() == alphaHead
	}, "readers behind: %s", func() string {
		var pending, minSeq, low, maxSeq int64
		_ = s1.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT count(*) FROM %[1]s.appends WHERE last_position IS NULL),
			(SELECT coalesce(min(seq), 0) FROM %[1]s.appends WHERE last_position IS NULL), (SELECT low_seq FROM %[1]s.sequencer),
			(SELECT max(seq) FROM %[1]s.events)`, s1.QuotedSchema())).Scan(&pending, &minSeq, &low, &maxSeq)
		return fmt.Sprintf("$all at %d of %d, alpha at %d of %d; %d unsequenced from seq %d, watermark %d, last seq %d",
			all.at(), head, alpha.at(), alphaHead, pending, minSeq, low, maxSeq)
	}())
	stopReaders()
	readers.Wait()
	t.Logf("readers caught up %v after the start", time.Since(start))

	for _, f := range []*follower{all, alpha} {
		require.NoError(t, f.err, "reader %s", f.name)
		require.Empty(t, f.violations, "reader %s", f.name)
		for id, n := range f.seen {
			// Plain checks: require's formatting is too slow for a loop
			// of tens of thousands under the race detector.
			e, ok := committed[id]
			switch {
			case n != 1:
				t.Fatalf("reader %s received event %s %d times", f.name, id, n)
			case rolledBack[id]:
				t.Fatalf("reader %s received rolled-back event %s", f.name, id)
			case !ok:
				t.Fatalf("reader %s received unknown event %s", f.name, id)
			case e != f.where[id]:
				t.Fatalf("reader %s: event %s is %v, appended as %v", f.name, id, f.where[id], e)
			}
		}
	}
	require.Len(t, all.seen, len(committed), "$all reader missed events")
	require.Len(t, alpha.seen, wantAlpha, "alpha reader missed events")
	for id, e := range committed {
		if all.seen[id] != 1 {
			t.Fatalf("$all reader skipped %s (%s@%d)", id, e.stream, e.version)
		}
	}

	// The run must have exercised the trap: events that committed after
	// events inserted later, which a reader following insertion order
	// would have skipped.
	var late int
	require.NoError(t, s1.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM (
		SELECT seq < max(seq) OVER (ORDER BY position ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS late
		FROM %s ev) x WHERE late`, eventsWithPositions(s1))).Scan(&late))
	t.Logf("%d events committed behind a later-inserted one", late)
	require.Positive(t, late)

	// The sequencer's search watermark followed: it is not stuck at 0.
	var low, maxSeq int64
	require.NoError(t, s1.Pool().QueryRow(ctx, fmt.Sprintf(`SELECT (SELECT low_seq FROM %[1]s.sequencer), (SELECT max(seq) FROM %[1]s.events)`,
		s1.QuotedSchema())).Scan(&low, &maxSeq))
	t.Logf("watermark at seq %d of %d", low, maxSeq)
	require.Greater(t, low, maxSeq/2)
}

// appendTx runs one appender transaction and returns its events and
// whether it rolled back.
func appendTx(ctx context.Context, s *eventsource.Store, rng *rand.Rand) (map[uuid.UUID]committedEvent, bool, error) {
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		return nil, false, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	streams := map[string]bool{}
	for range 1 + rng.IntN(3) {
		cat := "alpha"
		if rng.IntN(2) == 0 {
			cat = "beta"
		}
		streams[fmt.Sprintf("%s-%d", cat, rng.IntN(noSkipStreams))] = true
	}
	names := make([]string, 0, len(streams))
	for name := range streams {
		names = append(names, name)
	}
	slices.Sort(names)
	out := map[uuid.UUID]committedEvent{}
	for _, stream := range names {
		evs := make([]eventsource.EventData, 1+rng.IntN(4))
		for i := range evs {
			evs[i] = ev("Happened", fmt.Sprintf(`{"i":%d}`, i))
		}
		res, err := s.AppendTx(ctx, tx, stream, eventsource.Any, evs)
		if err != nil {
			return nil, false, err
		}
		for i, id := range res.IDs {
			out[id] = committedEvent{stream, res.FirstVersion + int64(i)}
		}
		jitter(rng)
	}
	jitter(rng)
	if rng.IntN(100) < noSkipRollbackPc {
		return out, true, tx.Rollback(ctx)
	}
	return out, false, tx.Commit(ctx)
}

// jitter sleeps inside a transaction: mostly not at all or briefly,
// sometimes long enough for many later transactions to commit first.
func jitter(rng *rand.Rand) {
	switch r := rng.IntN(100); {
	case r < 50:
	case r < 97:
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
	default:
		time.Sleep(time.Duration(5+rng.IntN(20)) * time.Millisecond)
	}
}

// follower reads from a cursor as a subscription does and checks what it
// gets as it goes.
type follower struct {
	name       string
	mu         sync.Mutex
	seen       map[uuid.UUID]int
	where      map[uuid.UUID]committedEvent
	versions   map[string]int64
	violations []string
	err        error
	cursor     int64
}

func newFollower(name string) *follower {
	return &follower{name: name, seen: map[uuid.UUID]int{}, where: map[uuid.UUID]committedEvent{}, versions: map[string]int64{}}
}

// at returns the reader's cursor.
func (f *follower) at() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cursor
}

func (f *follower) run(ctx context.Context, wake <-chan struct{}, read func(after int64) ([]eventsource.RecordedEvent, error)) {
	var cursor int64
	for ctx.Err() == nil {
		evs, err := read(cursor)
		if err != nil {
			if ctx.Err() == nil {
				f.err = err
			}
			return
		}
		f.mu.Lock()
		for _, e := range evs {
			if e.Position <= cursor {
				f.violations = append(f.violations, fmt.Sprintf("position %d after cursor %d", e.Position, cursor))
			}
			if f.name == "$all" && e.Position != cursor+1 {
				f.violations = append(f.violations, fmt.Sprintf("gap: position %d after %d", e.Position, cursor))
			}
			cursor = e.Position
			f.cursor = cursor
			prev, ok := f.versions[e.Stream]
			if !ok {
				prev = -1
			}
			if e.Version != prev+1 {
				f.violations = append(f.violations, fmt.Sprintf("%s: version %d after %d", e.Stream, e.Version, prev))
			}
			f.versions[e.Stream] = e.Version
			f.seen[e.ID]++
			f.where[e.ID] = committedEvent{e.Stream, e.Version}
		}
		f.mu.Unlock()
		if len(evs) > 0 {
			continue
		}
		if wake == nil {
			time.Sleep(2 * time.Millisecond) // a plain polling reader
			continue
		}
		select {
		case <-ctx.Done():
		case <-wake:
		}
	}
}
