package eventsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// The benchmarks print figures; they assert nothing about speed. Each
// measures kumi beside the same work done raw, in the same run, on the
// same server, and prints the ratio. Run them with
//
//	make bench
//
// or, for the event store alone,
//
//	go test -run '^$' -bench . -benchtime 1x ./eventsource/
//
// With -benchtime 1x each benchmark does its fixed workload once; a larger
// -benchtime repeats it.

// Append workload sizes.
const (
	benchAppendEvents = 8000 // events per single-event run
	benchBatchSize    = 100
	benchBatchCount   = 160 // batches per batch run
	benchStreams      = 1000
)

func BenchmarkAppend(b *testing.B) {
	cases := []struct {
		name    string
		writers int
		batch   int
	}{
		{"Single/Writers1", 1, 1},
		{"Single/Writers16", 16, 1},
		{"Batch100/Writers1", 1, benchBatchSize},
		{"Batch100/Writers16", 16, benchBatchSize},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.NewPool(b, int32(c.writers+4))
			s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(b)})
			require.NoError(b, err)
			require.NoError(b, s.Migrate(ctx))
			_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.raw_events (event_id uuid, stream_name text, type text,
				data jsonb, metadata jsonb, recorded_at timestamptz NOT NULL DEFAULT now())`, s.QuotedSchema()))
			require.NoError(b, err)
			rawSQL := fmt.Sprintf(`INSERT INTO %s.raw_events (event_id, stream_name, type, data, metadata)
				SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::jsonb[])`, s.QuotedSchema())

			total := benchAppendEvents
			if c.batch > 1 {
				total = benchBatchCount * c.batch
			}
			perWriter := total / c.writers / c.batch // calls per writer
			data := json.RawMessage(`{"amount":42,"currency":"EUR","note":"benchmark event payload"}`)

			var rawTime, storeTime, seqLag time.Duration
			for i := 0; i < b.N; i++ {
				rawTime += runWriters(b, c.writers, perWriter, func(w, j int) error {
					n := c.batch
					ids, streams := make([]uuid.UUID, n), make([]string, n)
					types, datas, metas := make([]string, n), make([]string, n), make([]*string, n)
					for k := range n {
						ids[k], _ = uuid.NewV7()
						streams[k], types[k], datas[k] = streamOf(w, j), "Deposited", string(data)
					}
					_, err := pool.Exec(ctx, rawSQL, ids, streams, types, datas, metas)
					return err
				})

				q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
				q.Start()
				head0, err := s.HeadPosition(ctx)
				require.NoError(b, err)
				d := runWriters(b, c.writers, perWriter, func(w, j int) error {
					evs := make([]eventsource.EventData, c.batch)
					for k := range evs {
						evs[k] = eventsource.EventData{Type: "Deposited", Data: data}
					}
					_, err := s.Append(ctx, streamOf(w, j), eventsource.Any, evs)
					return err
				})
				// How long after the last append the last event got its
				// position.
				appended := time.Now()
				require.True(b, pgtest.WaitFor(time.Minute, func() bool {
					h, err := s.HeadPosition(ctx)
					return err == nil && h == head0+int64(c.writers*perWriter*c.batch)
				}))
				seqLag += time.Since(appended)
				storeTime += d
				q.Stop()
			}
			events := float64(b.N * c.writers * perWriter * c.batch)
			rawRate := events / rawTime.Seconds()
			storeRate := events / storeTime.Seconds()
			b.ReportMetric(storeRate, "events/s")
			b.ReportMetric(rawRate, "raw-events/s")
			b.ReportMetric(100*storeRate/rawRate, "%-of-raw")
			b.ReportMetric(float64(seqLag.Milliseconds())/float64(b.N), "ms-seq-lag")
			b.Logf("append %s: kumi %.0f events/s, raw INSERT %.0f events/s: %.0f%% of raw; last position assigned %v after the last append",
				c.name, storeRate, rawRate, 100*storeRate/rawRate, seqLag/time.Duration(b.N))
		})
	}
}

// streamOf returns the stream of writer w's call j: writers cycle through
// benchStreams streams, so single-event appends rarely wait on each other.
func streamOf(w, j int) string {
	return fmt.Sprintf("account-%d", (w*7919+j)%benchStreams)
}

// runWriters runs calls of fn from writers goroutines, perWriter each, and
// returns the wall time.
func runWriters(b *testing.B, writers, perWriter int, fn func(w, j int) error) time.Duration {
	var wg sync.WaitGroup
	var failed atomic.Value
	start := time.Now()
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range perWriter {
				if err := fn(w, j); err != nil {
					failed.Store(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(start)
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	return d
}

// Drain workload: one category of drainEvents events over drainStreams
// streams, read by drainMembers consumer-group members in parallel.
const (
	drainEvents  = 1_000_000
	drainStreams = 10_000
	drainMembers = 8
	drainPage    = 1000
)

func BenchmarkConsumerGroupDrain(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewPool(b, drainMembers+4)
	s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(b)})
	require.NoError(b, err)
	require.NoError(b, s.Migrate(ctx))

	start := time.Now()
	seedDrain(b, s)
	seeded := time.Since(start)
	start = time.Now()
	n, err := s.Sequence(ctx)
	require.NoError(b, err)
	require.Equal(b, drainEvents, n)
	sequenced := time.Since(start)
	start = time.Now()
	require.NoError(b, s.EnsureConsumerGroupIndex(ctx, drainMembers))
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+s.QuotedSchema()+".events")
	require.NoError(b, err)
	indexed := time.Since(start)
	b.Logf("drain seed: %d events inserted in %v, sequenced in %v, indexed and vacuumed in %v", drainEvents, seeded, sequenced, indexed)

	rawSQL := fmt.Sprintf(`SELECT event_id, stream_name, category, version, coalesce(position, 0), cg_hash, type, data, metadata, recorded_at
		FROM %s.events WHERE category = $1 AND position > $2 AND position <= $3 ORDER BY position LIMIT $4`, s.QuotedSchema())

	var rawTime, storeTime time.Duration
	for range b.N {
		// Raw: the same rows, split into drainMembers contiguous position
		// ranges scanned in parallel on the (category, position) index.
		rawTime += drainParallel(b, func(m int) (int, error) {
			lo, hi := int64(m*drainEvents/drainMembers), int64((m+1)*drainEvents/drainMembers)
			total := 0
			for {
				rows, err := pool.Query(ctx, rawSQL, "bench", lo, hi, drainPage)
				if err != nil {
					return total, err
				}
				got, last, err := scanRaw(rows)
				if err != nil || got == 0 {
					return total, err
				}
				total += got
				lo = last
			}
		})
		storeTime += drainParallel(b, func(m int) (int, error) {
			var after int64
			total := 0
			for {
				evs, err := s.ReadMember(ctx, "bench", m, drainMembers, after, drainPage)
				if err != nil || len(evs) == 0 {
					return total, err
				}
				total += len(evs)
				after = evs[len(evs)-1].Position
			}
		})
	}
	events := float64(b.N * drainEvents)
	rawRate, storeRate := events/rawTime.Seconds(), events/storeTime.Seconds()
	b.ReportMetric(storeRate, "events/s")
	b.ReportMetric(rawRate, "raw-events/s")
	b.ReportMetric(100*storeRate/rawRate, "%-of-raw")
	b.Logf("drain of %d events by %d members: kumi %.0f events/s (%v), raw range scan %.0f events/s (%v): %.0f%% of raw",
		drainEvents, drainMembers, storeRate, storeTime/time.Duration(b.N), rawRate, rawTime/time.Duration(b.N), 100*storeRate/rawRate)
}

// seedDrain inserts the drain's events straight into the events table with
// one INSERT … SELECT generate_series (ids are random v4 UUIDs, data a small
// object), as appends would have written them but unsequenced; the
// benchmark then sequences them with one Store.Sequence call.
func seedDrain(b *testing.B, s *eventsource.Store) {
	ctx := context.Background()
	q := s.QuotedSchema()
	_, err := s.Pool().Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.events (event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT gen_random_uuid(), 'bench-' || (i %% %[2]d), 'bench', (i %% %[2]d)::text, %[1]s.cg_hash((i %% %[2]d)::text),
       i / %[2]d, 'Seeded', jsonb_build_object('i', i, 'note', 'seeded benchmark event')
FROM generate_series(0, %[3]d - 1) AS i ORDER BY i`, q, drainStreams, drainEvents))
	require.NoError(b, err)
	_, err = s.Pool().Exec(ctx, fmt.Sprintf(`INSERT INTO %s.streams (stream_name, version)
SELECT 'bench-' || i, %d - 1 FROM generate_series(0, %d - 1) AS i`, q, drainEvents/drainStreams, drainStreams))
	require.NoError(b, err)
}

func drainParallel(b *testing.B, member func(m int) (int, error)) time.Duration {
	var wg sync.WaitGroup
	var total atomic.Int64
	errs := make([]error, drainMembers)
	start := time.Now()
	for m := range drainMembers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := member(m)
			total.Add(int64(n))
			errs[m] = err
		}()
	}
	wg.Wait()
	d := time.Since(start)
	for _, err := range errs {
		require.NoError(b, err)
	}
	require.Equal(b, int64(drainEvents), total.Load())
	return d
}

// scanRaw decodes rows into the same fields a RecordedEvent has and
// returns the count and the last position.
func scanRaw(rows pgx.Rows) (int, int64, error) {
	defer rows.Close()
	n, last := 0, int64(0)
	for rows.Next() {
		var e eventsource.RecordedEvent
		var meta []byte
		if err := rows.Scan(&e.ID, &e.Stream, &e.Category, &e.Version, &e.Position, &e.Hash,
			&e.Type, &e.Data, &meta, &e.RecordedAt); err != nil {
			return n, last, err
		}
		n++
		last = e.Position
	}
	return n, last, rows.Err()
}
