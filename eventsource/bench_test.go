package eventsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
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

// benchStreams is how many streams the append benchmarks spread over.
const benchStreams = 1000

// benchRounds is how many times each append benchmark alternates raw and
// kumi runs (which goes first alternates too). Interleaving spreads
// background noise (autovacuum, checkpoints, other processes) over both,
// and the ratio reported is the median of the rounds' ratios.
const benchRounds = 8

func BenchmarkAppend(b *testing.B) {
	cases := []struct {
		name    string
		writers int
		batch   int // events per append
		calls   int // appends per writer per round
	}{
		{"Single/Writers1", 1, 1, 1000},
		{"Single/Writers16", 16, 1, 250},
		{"Batch100/Writers1", 1, 100, 40},
		{"Batch100/Writers16", 16, 100, 8},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			ctx := context.Background()
			pool := pgtest.NewPool(b, int32(c.writers+4))
			s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(b)})
			require.NoError(b, err)
			require.NoError(b, s.Migrate(ctx))
			// The bare table: the same columns, no index, no constraint.
			_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.raw_events (event_id uuid, stream_name text, type text,
				data jsonb, metadata jsonb, recorded_at timestamptz NOT NULL DEFAULT now())`, s.QuotedSchema()))
			require.NoError(b, err)
			rawOne := fmt.Sprintf(`INSERT INTO %s.raw_events (event_id, stream_name, type, data, metadata)
				VALUES ($1, $2, $3, $4::text::jsonb, $5::text::jsonb)`, s.QuotedSchema())
			rawMany := fmt.Sprintf(`INSERT INTO %s.raw_events (event_id, stream_name, type, data, metadata)
				SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]::jsonb[], $5::text[]::jsonb[])`, s.QuotedSchema())
			data := json.RawMessage(`{"amount":42,"currency":"EUR","note":"benchmark event payload"}`)

			raw := func(w, j int) error {
				n := c.batch
				ids, streams := make([]uuid.UUID, n), make([]string, n)
				types, datas, metas := make([]string, n), make([]string, n), make([]*string, n)
				for k := range n {
					ids[k], _ = uuid.NewV7()
					streams[k], types[k], datas[k] = streamOf(w, j), "Deposited", string(data)
				}
				var err error
				if n == 1 {
					_, err = pool.Exec(ctx, rawOne, ids[0], streams[0], types[0], datas[0], metas[0])
				} else {
					_, err = pool.Exec(ctx, rawMany, ids, streams, types, datas, metas)
				}
				return err
			}
			kumi := func(w, j int) error {
				evs := make([]eventsource.EventData, c.batch)
				for k := range evs {
					evs[k] = eventsource.EventData{Type: "Deposited", Data: data}
				}
				_, err := s.Append(ctx, streamOf(w, j), eventsource.Any, evs)
				return err
			}

			// The sequencer runs throughout, as in production: its work
			// is part of the cost of an append.
			q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
			q.Start()
			defer q.Stop()
			walNow := func() int64 {
				var lsn int64
				require.NoError(b, pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&lsn))
				return lsn
			}
			meter := newCPUMeter(ctx, pool)
			var rawCPU, storeCPU cpuSample
			var rawTime, storeTime, seqLag time.Duration
			var rawWAL, storeWAL int64
			var ratios []float64
			perRound := int64(c.writers * c.calls * c.batch)
			for round := range b.N * benchRounds {
				var rawD, storeD time.Duration
				runRaw := func() {
					w0, c0 := walNow(), meter.now()
					rawD = runWriters(b, c.writers, c.calls, raw)
					meter.add(&rawCPU, c0)
					rawWAL += walNow() - w0
				}
				if round%2 == 0 {
					runRaw()
				}
				head0, err := s.HeadPosition(ctx)
				require.NoError(b, err)
				w0, c0 := walNow(), meter.now()
				storeD = runWriters(b, c.writers, c.calls, kumi)
				// How long after the last append the last event got its
				// position.
				appended := time.Now()
				require.True(b, pgtest.WaitFor(time.Minute, func() bool {
					h, err := s.HeadPosition(ctx)
					return err == nil && h == head0+perRound
				}))
				seqLag += time.Since(appended)
				meter.add(&storeCPU, c0) // the sequencer's work included
				storeWAL += walNow() - w0
				if round%2 == 1 {
					runRaw()
				}
				rawTime += rawD
				storeTime += storeD
				ratios = append(ratios, rawD.Seconds()/storeD.Seconds())
			}
			events := float64(int64(b.N*benchRounds) * perRound)
			rawRate := events / rawTime.Seconds()
			storeRate := events / storeTime.Seconds()
			ratio := 100 * median(ratios)
			lag := seqLag / time.Duration(b.N*benchRounds)
			b.ReportMetric(storeRate, "events/s")
			b.ReportMetric(rawRate, "raw-events/s")
			b.ReportMetric(ratio, "%-of-raw")
			b.ReportMetric(float64(lag.Microseconds())/1000, "ms-seq-lag")
			b.ReportMetric(float64(storeWAL)/events, "WAL-B/event")
			b.ReportMetric(float64(rawWAL)/events, "raw-WAL-B/event")
			us := func(sec float64) float64 { return sec / events * 1e6 }
			b.ReportMetric(us(storeCPU.client), "client-µs/event")
			b.ReportMetric(us(rawCPU.client), "raw-client-µs/event")
			cpu := fmt.Sprintf("client CPU %.1f µs/event (raw %.1f)", us(storeCPU.client), us(rawCPU.client))
			if storeCPU.server >= 0 && rawCPU.server >= 0 {
				b.ReportMetric(us(storeCPU.server), "server-µs/event")
				b.ReportMetric(us(rawCPU.server), "raw-server-µs/event")
				cpu = fmt.Sprintf("server CPU %.1f µs/event (raw %.1f), %s", us(storeCPU.server), us(rawCPU.server), cpu)
			}
			b.Logf("append %s: kumi %.0f events/s, raw INSERT %.0f events/s: %.0f%% of raw (median of %d rounds, %.0f events); "+
				"last position assigned %v after the last append; sequencing included: WAL %.0f bytes/event (raw %.0f), %s",
				c.name, storeRate, rawRate, ratio, len(ratios), events, lag.Round(time.Millisecond),
				float64(storeWAL)/events, float64(rawWAL)/events, cpu)
		})
	}
}

// median returns the median of xs.
func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
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
// streams, read by drainBuckets consumer-group buckets in parallel.
const (
	drainEvents  = 1_000_000
	drainStreams = 10_000
	drainBuckets = 8
	drainPage    = 1000
	drainRounds  = 4
)

func BenchmarkConsumerGroupDrain(b *testing.B) {
	ctx := context.Background()
	pool := pgtest.NewPool(b, drainBuckets+4)
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
	require.NoError(b, s.EnsureConsumerGroupIndex(ctx, drainBuckets))
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+s.QuotedSchema()+".events")
	require.NoError(b, err)
	indexed := time.Since(start)
	b.Logf("drain seed: %d events inserted in %v, sequenced in %v (%.0f events/s), indexed and vacuumed in %v",
		drainEvents, seeded.Round(time.Millisecond), sequenced.Round(time.Millisecond), drainEvents/sequenced.Seconds(), indexed.Round(time.Millisecond))

	// The plan of a bucket's page, for the record.
	rows, err := pool.Query(ctx, "EXPLAIN "+s.BucketSQL(drainBuckets), "bench", 3, drainEvents/2, drainPage)
	require.NoError(b, err)
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(b, err)
	b.Logf("bucket read plan: %s", strings.TrimSpace(plan[min(1, len(plan)-1)]))

	rawSQL := fmt.Sprintf(`SELECT event_id, stream_name, category, version, coalesce(position, 0), cg_hash, type, data, metadata, recorded_at
		FROM %s.events WHERE category = $1 AND position > $2 AND position <= $3 ORDER BY position LIMIT $4`, s.QuotedSchema())

	var rawTime, storeTime time.Duration
	var ratios []float64
	for round := range b.N * drainRounds {
		// Raw: the same rows, split into drainBuckets contiguous position
		// ranges scanned in parallel on the (category, position) index.
		raw := func() time.Duration {
			return drainParallel(b, func(m int) (int, error) {
				lo, hi := int64(m*drainEvents/drainBuckets), int64((m+1)*drainEvents/drainBuckets)
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
		}
		var rawD time.Duration
		if round%2 == 0 {
			rawD = raw()
		}
		storeD := drainParallel(b, func(m int) (int, error) {
			var after int64
			total := 0
			for {
				evs, err := s.ReadBucket(ctx, "bench", m, drainBuckets, after, drainPage)
				if err != nil || len(evs) == 0 {
					return total, err
				}
				total += len(evs)
				after = evs[len(evs)-1].Position
			}
		})
		if round%2 == 1 {
			rawD = raw()
		}
		rawTime += rawD
		storeTime += storeD
		ratios = append(ratios, rawD.Seconds()/storeD.Seconds())
	}

	// For reference: one reader draining the whole category.
	start = time.Now()
	var after int64
	for {
		evs, err := s.ReadCategory(ctx, "bench", after, drainPage)
		require.NoError(b, err)
		if len(evs) == 0 {
			break
		}
		after = evs[len(evs)-1].Position
	}
	single := time.Since(start)

	events := float64(b.N * drainRounds * drainEvents)
	rawRate, storeRate := events/rawTime.Seconds(), events/storeTime.Seconds()
	ratio := 100 * median(ratios)
	b.ReportMetric(storeRate, "events/s")
	b.ReportMetric(rawRate, "raw-events/s")
	b.ReportMetric(ratio, "%-of-raw")
	b.ReportMetric(drainEvents/single.Seconds(), "one-reader-events/s")
	b.ReportMetric(drainEvents/sequenced.Seconds(), "sequenced-events/s")
	b.Logf("drain of %d events by %d buckets: kumi %.0f events/s (%v a drain), raw range scan %.0f events/s (%v): %.0f%% of raw (median of %d rounds); "+
		"one reader of the whole category: %.0f events/s",
		drainEvents, drainBuckets, storeRate, (storeTime / time.Duration(b.N*drainRounds)).Round(time.Millisecond),
		rawRate, (rawTime / time.Duration(b.N*drainRounds)).Round(time.Millisecond), ratio, len(ratios),
		drainEvents/single.Seconds())
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

func drainParallel(b *testing.B, bucket func(m int) (int, error)) time.Duration {
	var wg sync.WaitGroup
	var total atomic.Int64
	errs := make([]error, drainBuckets)
	start := time.Now()
	for m := range drainBuckets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := bucket(m)
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

// scanRaw decodes rows into the same fields a RecordedEvent has, the way
// the store does, and returns the count and the last position.
func scanRaw(rows pgx.Rows) (int, int64, error) {
	defer rows.Close()
	n, last := 0, int64(0)
	for rows.Next() {
		var e eventsource.RecordedEvent
		var meta []byte
		if err := rows.Scan(&e.ID, &e.Stream, &e.Category, &e.Version, &e.Position, &e.Hash,
			&e.Type, (*[]byte)(&e.Data), &meta, &e.RecordedAt); err != nil {
			return n, last, err
		}
		n++
		last = e.Position
	}
	return n, last, rows.Err()
}
