package eventsource_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// benchSeconds is how long BenchmarkSustainedAppend's writers append, each
// side: KUMI_BENCH_SECONDS, default 20.
func benchSeconds() time.Duration {
	if n, err := strconv.Atoi(os.Getenv("KUMI_BENCH_SECONDS")); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	return 20 * time.Second
}

// BenchmarkSustainedAppend: 16 writers append 100-event batches for
// benchSeconds with a Sequencer running, and, in the same run, insert the
// same rows into a bare table for as long. It reports the append rate, the
// rate at which positions were handed out over the same window (the
// store's sustained rate is the lower of the two: above the sequencer's
// rate the backlog grows), the backlog left when the writers stopped and
// how long the sequencer took to work it off. KUMI_BENCH_FILLFACTOR sets
// the events table's fillfactor first (an alternative measured: room on
// each page for the sequencer's new row versions).
func BenchmarkSustainedAppend(b *testing.B) {
	const writers, batch = 16, 100
	ctx := context.Background()
	pool := pgtest.NewPool(b, writers+4)
	s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(b)})
	require.NoError(b, err)
	require.NoError(b, s.Migrate(ctx))
	if ff := os.Getenv("KUMI_BENCH_FILLFACTOR"); ff != "" {
		_, err = pool.Exec(ctx, "ALTER TABLE "+s.QuotedSchema()+".events SET (fillfactor = "+ff+")")
		require.NoError(b, err)
	}
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.raw_events (event_id uuid, stream_name text, type text,
		data jsonb, metadata jsonb, recorded_at timestamptz NOT NULL DEFAULT now())`, s.QuotedSchema()))
	require.NoError(b, err)
	rawMany := fmt.Sprintf(`INSERT INTO %s.raw_events (event_id, stream_name, type, data, metadata)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]::jsonb[], $5::text[]::jsonb[])`, s.QuotedSchema())
	data := json.RawMessage(`{"amount":42,"currency":"EUR","note":"benchmark event payload"}`)
	d := benchSeconds()

	// for runs fn from the writers until d has passed and returns the
	// events written.
	run := func(fn func(w, j int) error) int64 {
		var total atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(d)
		for w := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := 0; time.Now().Before(end); j++ {
					if err := fn(w, j); err != nil {
						b.Error(err)
						return
					}
					total.Add(batch)
				}
			}()
		}
		wg.Wait()
		return total.Load()
	}
	raw := func(w, j int) error {
		ids, streams := make([]uuid.UUID, batch), make([]string, batch)
		types, datas, metas := make([]string, batch), make([]string, batch), make([]*string, batch)
		for k := range batch {
			ids[k], _ = uuid.NewV7()
			streams[k], types[k], datas[k] = streamOf(w, j), "Deposited", string(data)
		}
		_, err := pool.Exec(ctx, rawMany, ids, streams, types, datas, metas)
		return err
	}
	evs := make([]eventsource.EventData, batch)
	for k := range evs {
		evs[k] = eventsource.EventData{Type: "Deposited", Data: data}
	}
	kumi := func(w, j int) error {
		_, err := s.Append(ctx, streamOf(w, j), eventsource.Any, evs)
		return err
	}
	var load [3]float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		_, _ = fmt.Sscan(string(b), &load[0], &load[1], &load[2])
	}

	for range b.N {
		rawN := run(raw)
		q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
		require.NoError(b, q.Start(ctx))
		head0, err := s.HeadPosition(ctx)
		require.NoError(b, err)
		start := time.Now()
		appended := run(kumi)
		window := time.Since(start)
		head1, err := s.HeadPosition(ctx)
		require.NoError(b, err)
		stopped := time.Now()
		require.True(b, pgtest.WaitFor(10*time.Minute, func() bool {
			h, err := s.HeadPosition(ctx)
			return err == nil && h == head0+appended
		}))
		drain := time.Since(stopped)
		require.NoError(b, q.Stop(ctx))
		// A step ended by its own idle timeout (a false alarm of the
		// stall bound under this load) would count as a failed step.
		st := q.Stats()

		appendRate := float64(appended) / window.Seconds()
		seqRate := float64(head1-head0) / window.Seconds()
		rawRate := float64(rawN) / d.Seconds()
		b.ReportMetric(appendRate, "appended-events/s")
		b.ReportMetric(seqRate, "sequenced-events/s")
		b.ReportMetric(rawRate, "raw-events/s")
		b.ReportMetric(100*min(appendRate, seqRate)/rawRate, "%-of-raw")
		b.ReportMetric(drain.Seconds(), "s-drain")
		b.Logf("sustained %v, %d writers × %d-event batches: appended %.0f events/s, sequenced %.0f events/s over the same window, "+
			"raw INSERT %.0f events/s; sustained %.0f%% of raw; backlog at the end %d events, worked off in %v; "+
			"sequencer: %d failed steps (last error: %v), %d timeouts; load average %.1f %.1f %.1f",
			d, writers, batch, appendRate, seqRate, rawRate, 100*min(appendRate, seqRate)/rawRate,
			head0+appended-head1, drain.Round(time.Millisecond), st.Failures, st.LastError, st.Timeouts, load[0], load[1], load[2])
	}
}

// BenchmarkSequencingAlternatives measures, on one backlog of seqAltEvents
// unsequenced events (seeded as BenchmarkConsumerGroupDrain seeds its
// own), what handing out positions costs the way the store does it (an
// UPDATE of each event row: a new version of the wide row and its index
// entries) beside a prototype of the alternative: positions kept in a
// narrow table of their own (position, seq, category, cg_hash; keys on
// position and seq, an index on (category, position)), in steps of the
// same size under the same kind of lock; and then what reading $all costs
// each way (pages of 1,000 by position: one index scan, or the narrow
// table joined to the events by seq).
func BenchmarkSequencingAlternatives(b *testing.B) {
	const seqAltEvents, step, page = 300_000, eventsource.SequencerBatchDefault, 1000
	ctx := context.Background()
	pool := pgtest.NewPool(b, 4)
	s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(b)})
	require.NoError(b, err)
	require.NoError(b, s.Migrate(ctx))
	q := s.QuotedSchema()
	_, err = pool.Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.events (event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT gen_random_uuid(), 'bench-' || (i %% 10000), 'bench', (i %% 10000)::text, %[1]s.cg_hash((i %% 10000)::text),
       i / 10000, 'Seeded', jsonb_build_object('i', i, 'note', 'seeded benchmark event')
FROM generate_series(0, %[2]d - 1) AS i ORDER BY i`, q, seqAltEvents))
	require.NoError(b, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`
CREATE TABLE %[1]s.narrow_positions (position bigint PRIMARY KEY, seq bigint NOT NULL UNIQUE, category text NOT NULL, cg_hash bigint NOT NULL);
CREATE INDEX ON %[1]s.narrow_positions (category, position);
CREATE TABLE %[1]s.narrow_head (id int PRIMARY KEY, last_position bigint NOT NULL, last_seq bigint NOT NULL);
INSERT INTO %[1]s.narrow_head VALUES (1, 0, 0);
CREATE INDEX events_seq_all ON %[1]s.events (seq);
CREATE TABLE %[1]s.append_ranges (seq bigint PRIMARY KEY, stream_name text NOT NULL, first_version bigint NOT NULL,
  last_version bigint NOT NULL, category text NOT NULL, cg_hash bigint NOT NULL, base bigint);
INSERT INTO %[1]s.append_ranges SELECT min(seq), stream_name, min(version), max(version), 'bench', min(cg_hash)
  FROM %[1]s.events GROUP BY stream_name ORDER BY min(seq);
CREATE INDEX append_ranges_unsequenced ON %[1]s.append_ranges (seq) WHERE base IS NULL;
CREATE UNIQUE INDEX append_ranges_base ON %[1]s.append_ranges (base) WHERE base IS NOT NULL;
CREATE INDEX append_ranges_category ON %[1]s.append_ranges (category, base) WHERE base IS NOT NULL;
CREATE TABLE %[1]s.range_head (id int PRIMARY KEY, last_position bigint NOT NULL);
INSERT INTO %[1]s.range_head VALUES (1, 0)`, q))
	require.NoError(b, err)
	_, err = pool.Exec(ctx, "VACUUM ANALYZE "+q+".events")
	require.NoError(b, err)
	narrowStep := fmt.Sprintf(`WITH h AS (SELECT last_position, last_seq FROM %[1]s.narrow_head WHERE id = 1 FOR UPDATE),
p AS (SELECT e.seq, e.category, e.cg_hash FROM %[1]s.events e, h WHERE e.seq > h.last_seq
  AND NOT EXISTS (SELECT 1 FROM %[1]s.narrow_positions n WHERE n.seq = e.seq) ORDER BY e.seq LIMIT $1),
ins AS (INSERT INTO %[1]s.narrow_positions SELECT h.last_position + row_number() OVER (ORDER BY p.seq), p.seq, p.category, p.cg_hash
  FROM p, h RETURNING position, seq),
upd AS (UPDATE %[1]s.narrow_head SET last_position = (SELECT max(position) FROM ins), last_seq = (SELECT max(seq) FROM ins)
  WHERE id = 1 AND EXISTS (SELECT 1 FROM ins) RETURNING 1)
SELECT count(*) FROM ins`, q)
	// One row per append (a range of one stream's versions): the
	// sequencer numbers appends, an event's position is its append's base
	// plus its offset in it.
	rangeStep := fmt.Sprintf(`WITH h AS (SELECT last_position FROM %[1]s.range_head WHERE id = 1 FOR UPDATE),
p AS (SELECT seq, last_version - first_version + 1 AS n FROM %[1]s.append_ranges WHERE base IS NULL ORDER BY seq LIMIT $1),
b AS (SELECT p.seq, h.last_position + sum(p.n) OVER (ORDER BY p.seq) - p.n + 1 AS base, h.last_position + sum(p.n) OVER (ORDER BY p.seq) AS last FROM p, h),
upd AS (UPDATE %[1]s.append_ranges a SET base = b.base FROM b WHERE a.seq = b.seq RETURNING b.last),
hh AS (UPDATE %[1]s.range_head SET last_position = (SELECT max(last) FROM upd) WHERE id = 1 AND EXISTS (SELECT 1 FROM upd) RETURNING 1)
SELECT coalesce(sum(1), 0)::int FROM upd`, q)
	readRanges := fmt.Sprintf(`SELECT e.event_id, e.stream_name, e.category, e.version, a.base + e.version - a.first_version, e.cg_hash, e.type, e.data, e.metadata, e.recorded_at
FROM %[1]s.append_ranges a JOIN %[1]s.events e ON e.stream_name = a.stream_name AND e.version BETWEEN a.first_version AND a.last_version
WHERE a.base IS NOT NULL AND a.base + a.last_version - a.first_version > $1 AND a.base + e.version - a.first_version > $1
ORDER BY a.base, e.version LIMIT $2`, q)
	readWide := fmt.Sprintf(`SELECT event_id, stream_name, category, version, position, cg_hash, type, data, metadata, recorded_at
FROM %s.events WHERE position > $1 ORDER BY position LIMIT $2`, q)
	readNarrow := fmt.Sprintf(`SELECT e.event_id, e.stream_name, e.category, e.version, p.position, e.cg_hash, e.type, e.data, e.metadata, e.recorded_at
FROM %[1]s.narrow_positions p JOIN %[1]s.events e ON e.seq = p.seq WHERE p.position > $1 ORDER BY p.position LIMIT $2`, q)
	walNow := func() int64 {
		var lsn int64
		require.NoError(b, pool.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&lsn))
		return lsn
	}
	meter := newCPUMeter(ctx, pool)
	drain := func(sql string) time.Duration {
		start := time.Now()
		var after int64
		for {
			rows, err := pool.Query(ctx, sql, after, page)
			require.NoError(b, err)
			n, last, err := scanRaw(rows)
			require.NoError(b, err)
			if n == 0 {
				return time.Since(start)
			}
			after = last
		}
	}

	for range b.N {
		// The narrow prototype first: the events' rows are still as
		// appended (no dead versions from the updates).
		var narrowCPU, wideCPU cpuSample
		w0, c0, start := walNow(), meter.now(), time.Now()
		for {
			var n int
			require.NoError(b, pool.QueryRow(ctx, narrowStep, step).Scan(&n))
			if n == 0 {
				break
			}
		}
		narrowD := time.Since(start)
		meter.add(&narrowCPU, c0)
		narrowWAL := walNow() - w0

		var rangeCPU cpuSample
		w0, c0, start = walNow(), meter.now(), time.Now()
		for {
			var n int
			require.NoError(b, pool.QueryRow(ctx, rangeStep, step/30).Scan(&n))
			if n == 0 {
				break
			}
		}
		rangeD := time.Since(start)
		meter.add(&rangeCPU, c0)
		rangeWAL := walNow() - w0

		w0, c0, start = walNow(), meter.now(), time.Now()
		n, err := s.Sequence(ctx)
		require.NoError(b, err)
		require.Equal(b, seqAltEvents, n)
		wideD := time.Since(start)
		meter.add(&wideCPU, c0)
		wideWAL := walNow() - w0

		for _, t := range []string{"events", "narrow_positions", "append_ranges"} {
			_, err = pool.Exec(ctx, "VACUUM ANALYZE "+q+"."+t)
			require.NoError(b, err)
		}
		readWideD, readNarrowD := drain(readWide), drain(readNarrow)
		readWideD2, readNarrowD2 := drain(readWide), drain(readNarrow)
		readWideD, readNarrowD = min(readWideD, readWideD2), min(readNarrowD, readNarrowD2)
		readRangesD := min(drain(readRanges), drain(readRanges))

		ev := float64(seqAltEvents)
		us := func(sec float64) float64 { return sec / ev * 1e6 }
		b.ReportMetric(ev/wideD.Seconds(), "update-events/s")
		b.ReportMetric(ev/narrowD.Seconds(), "narrow-events/s")
		b.ReportMetric(ev/readWideD.Seconds(), "read-events/s")
		b.ReportMetric(ev/readNarrowD.Seconds(), "read-joined-events/s")
		b.ReportMetric(ev/rangeD.Seconds(), "ranges-events/s")
		b.ReportMetric(ev/readRangesD.Seconds(), "read-ranges-events/s")
		b.Logf("sequencing %d events in steps of %d: the store's UPDATE %.0f events/s (server CPU %.1f µs/event, WAL %.0f B/event); "+
			"narrow positions table %.0f events/s (server CPU %.1f µs/event, WAL %.0f B/event); "+
			"one row per append (30-event appends) %.0f events/s (server CPU %.2f µs/event, WAL %.0f B/event); "+
			"reading $all in pages of %d: %.0f events/s from the events, %.0f events/s joined from the narrow table, %.0f events/s from the append ranges",
			seqAltEvents, step, ev/wideD.Seconds(), us(wideCPU.server), float64(wideWAL)/ev,
			ev/narrowD.Seconds(), us(narrowCPU.server), float64(narrowWAL)/ev,
			ev/rangeD.Seconds(), us(rangeCPU.server), float64(rangeWAL)/ev,
			page, ev/readWideD.Seconds(), ev/readNarrowD.Seconds(), ev/readRangesD.Seconds())
	}
}
