package eventsource_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

func TestBatchBytesAreBoundedBeforeAnythingIsSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)

	// Within the documented per-event and per-batch-count limits, but
	// 70 MiB in all: refused before it is encoded or sent.
	big := eventsource.EventData{Type: "Big", Data: json.RawMessage(`"` + strings.Repeat("x", eventsource.MaxEventSizeDefault-10) + `"`)}
	batch := make([]eventsource.EventData, 70)
	for i := range batch {
		batch[i] = big
	}
	_, err := s.Append(ctx, "bulk-1", eventsource.Any, batch)
	var evErr *eventsource.EventError
	require.ErrorAs(t, err, &evErr)
	require.Contains(t, evErr.Reason, "MaxBatchBytes")
	require.Equal(t, eventsource.MaxBatchBytesDefault/eventsource.MaxEventSizeDefault, evErr.Index,
		"the error names the event that takes the batch over")
	require.Equal(t, 0, countRows(t, s, "events"))

	// A configured bound counts data, metadata and type.
	small, err := eventsource.New(s.Pool(), eventsource.Config{Schema: s.Schema(), MaxEventSize: 1000, MaxBatchBytes: 2500})
	require.NoError(t, err)
	e := eventsource.EventData{Type: "T", Data: json.RawMessage(`"` + strings.Repeat("x", 800) + `"`), Metadata: json.RawMessage(`{"m":"` + strings.Repeat("y", 100) + `"}`)}
	_, err = small.Append(ctx, "bulk-2", eventsource.Any, []eventsource.EventData{e, e, e})
	require.ErrorAs(t, err, &evErr)
	require.Equal(t, 2, evErr.Index)
	_, err = small.Append(ctx, "bulk-2", eventsource.Any, []eventsource.EventData{e, e})
	require.NoError(t, err)
}

func TestBatchBytesConfigIsValidated(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	for name, cfg := range map[string]eventsource.Config{
		"Negative":           {MaxBatchBytes: -1},
		"BelowAnEvent":       {MaxEventSize: 1 << 20, MaxBatchBytes: 1 << 19},
		"AboveTheLimit":      {MaxBatchBytes: eventsource.MaxBatchBytesLimit + 1},
		"EventAboveTheLimit": {MaxEventSize: eventsource.MaxBatchBytesLimit + 1},
	} {
		_, err := eventsource.New(pool, cfg)
		var cfgErr *kumierr.ConfigError
		require.ErrorAs(t, err, &cfgErr, name)
		require.Contains(t, []string{"eventsource.Config.MaxBatchBytes", "eventsource.Config.MaxEventSize"}, cfgErr.Field, name)
		require.Contains(t, cfgErr.Reason, "MaxBatchBytes", name)
	}
	// A large MaxEventSize raises the default batch bound with it.
	_, err := eventsource.New(pool, eventsource.Config{MaxEventSize: 100 << 20})
	require.NoError(t, err)
}

// A group size beyond the bound made the index expression overflow: every
// sequencing UPDATE then failed with "bigint out of range", store-wide.
func TestGroupSizesAreBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	for _, n := range []int{0, -1, eventsource.MaxGroupSize + 1, 1<<62 + 1} {
		err := s.EnsureConsumerGroupIndex(ctx, n)
		var cfgErr *kumierr.ConfigError
		require.ErrorAs(t, err, &cfgErr, "%d", n)
		require.Contains(t, cfgErr.Reason, "65536", "%d", n)
		_, err = s.ReadBucket(ctx, "cat", 0, n, 0, 0)
		require.ErrorIs(t, err, eventsource.ErrInvalidBucket, "%d", n)
		_, _, err = s.BucketLag(ctx, "cat", 0, n, 0)
		require.ErrorIs(t, err, eventsource.ErrInvalidBucket, "%d", n)
	}
	// Sequencing goes on.
	mustAppend(t, s, "cat-1", ev("A", `{}`))
	sequenceAll(t, s)
	all, err := s.ReadAll(ctx, 0, 0)
	require.NoError(t, err)
	require.Len(t, all, 1)
	// The largest size works end to end.
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, eventsource.MaxGroupSize))
	m, err := s.ReadBucket(ctx, "cat", all[0].Bucket(eventsource.MaxGroupSize), eventsource.MaxGroupSize, 0, 0)
	require.NoError(t, err)
	require.Len(t, m, 1)
}
