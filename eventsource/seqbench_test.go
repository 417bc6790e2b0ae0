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

// sustainedSlices is how many slices BenchmarkSustainedAppend cuts each
// side's time into, alternating raw and kumi (and which goes first), so
// that the load of a shared machine falls on both alike.
const sustainedSlices = 10

// BenchmarkSustainedAppend: 16 writers append 100-event batches for
// benchSeconds with a Sequencer running, and, in the same run, insert the
// same rows into a bare table for as long, in alternating slices. It
// reports the append rate, the rate at which positions were handed out
// while the writers appended (the store's sustained rate is the lower of
// the two: above the sequencer's rate the backlog grows), both as a
// percentage of the bare insert's rate, the backlog left when the writers
// stopped and how long the sequencer took to work it off. Rerun on a quiet
// machine with
//
//	go test -run '^$' -bench BenchmarkSustainedAppend -benchtime 1x ./eventsource/
func BenchmarkSustainedAppend(b *testing.B) {
	const writers, batch = 16, 100
	ctx := context.Background()
	pool := pgtest.NewPool(b, writers+4)
	s, err := eventsource.New(pool, eventsource.Config{Schema: pgtest.NewSchema(b)})
	require.NoError(b, err)
	require.NoError(b, s.Migrate(ctx))
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s.raw_events (event_id uuid, stream_name text, type text,
		data jsonb, metadata jsonb, recorded_at timestamptz NOT NULL DEFAULT now())`, s.QuotedSchema()))
	require.NoError(b, err)
	rawMany := fmt.Sprintf(`INSERT INTO %s.raw_events (event_id, stream_name, type, data, metadata)
		SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[]::jsonb[], $5::text[]::jsonb[])`, s.QuotedSchema())
	data := json.RawMessage(`{"amount":42,"currency":"EUR","note":"benchmark event payload"}`)
	slice := benchSeconds() / sustainedSlices

	// run runs fn from the writers for one slice and returns the events
	// written.
	run := func(fn func(w, j int) error) int64 {
		var total atomic.Int64
		var wg sync.WaitGroup
		end := time.Now().Add(slice)
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
	head := func() int64 {
		h, err := s.HeadPosition(ctx)
		require.NoError(b, err)
		return h
	}
	var load [3]float64
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		_, _ = fmt.Sscan(string(b), &load[0], &load[1], &load[2])
	}

	for range b.N {
		q := eventsource.NewSequencer(s, eventsource.SequencerOptions{})
		require.NoError(b, q.Start(ctx))
		head0 := head()
		var rawN, appended, sequenced int64
		var window time.Duration
		for i := range 2 * sustainedSlices {
			if (i+i/2)%2 == 0 { // raw, kumi, kumi, raw, raw, kumi, …
				rawN += run(raw)
				continue
			}
			h, start := head(), time.Now()
			appended += run(kumi)
			window += time.Since(start)
			sequenced += head() - h
		}
		head1 := head()
		stopped := time.Now()
		require.True(b, pgtest.WaitFor(10*time.Minute, func() bool { return head() == head0+appended }))
		drain := time.Since(stopped)
		require.NoError(b, q.Stop(ctx))
		// A step ended by its own idle timeout (a false alarm of the
		// stall bound under this load) would count as a failed step.
		st := q.Stats()

		appendRate := float64(appended) / window.Seconds()
		seqRate := float64(sequenced) / window.Seconds()
		rawRate := float64(rawN) / (slice * sustainedSlices).Seconds()
		b.ReportMetric(appendRate, "appended-events/s")
		b.ReportMetric(seqRate, "sequenced-events/s")
		b.ReportMetric(rawRate, "raw-events/s")
		b.ReportMetric(100*appendRate/rawRate, "%-appended-of-raw")
		b.ReportMetric(100*min(appendRate, seqRate)/rawRate, "%-of-raw")
		b.ReportMetric(drain.Seconds(), "s-drain")
		b.Logf("sustained %v each side in %d alternating slices, %d writers × %d-event batches: appended %.0f events/s, "+
			"sequenced %.0f events/s while they appended, raw INSERT %.0f events/s; sustained %.0f%% of raw (appends alone %.0f%%); "+
			"backlog at the end %d events, worked off in %v; sequencer: %d failed steps (last error: %v), %d timeouts; load average %.1f %.1f %.1f",
			slice*sustainedSlices, sustainedSlices, writers, batch, appendRate, seqRate, rawRate, 100*min(appendRate, seqRate)/rawRate,
			100*appendRate/rawRate, head0+appended-head1, drain.Round(time.Millisecond), st.Failures, st.LastError, st.Timeouts,
			load[0], load[1], load[2])
	}
}
