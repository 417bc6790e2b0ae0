package eventsource_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// hugeNumbers is a JSON array of n numbers that jsonb prints as 131,072
// digits each: a few bytes in, a huge text form out.
func hugeNumbers(n int) string {
	return "[" + strings.TrimSuffix(strings.Repeat("1e131071,", n), ",") + "]"
}

func TestAppendBoundsTheTextForm(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)

	// 54 KB in, ~700 MB out: the "smaller version" that cost a worker
	// 5.3 GB of memory per four events.
	_, err := s.Append(ctx, "poison-1", eventsource.Any, []eventsource.EventData{
		ev("Ok", `{"a":1}`), ev("Huge", hugeNumbers(5400)),
	})
	var evErr *eventsource.EventError
	require.ErrorAs(t, err, &evErr)
	require.Equal(t, 1, evErr.Index, "the error names the event")
	require.Contains(t, evErr.Reason, "MaxEventSize")
	require.Equal(t, 0, countRows(t, s, "events"), "nothing of the batch is written")

	// A number within the bound that PostgreSQL still refuses (a scale
	// beyond numeric's 16,383 digits) is refused as before.
	_, err = s.Append(ctx, "poison-1", eventsource.Any, []eventsource.EventData{ev("Scale", `[1.0e-20000]`)})
	require.ErrorAs(t, err, &evErr)
	require.Equal(t, -1, evErr.Index, "%v", err)

	// The bound is the text form: one such number fits in 1 MiB...
	mustAppend(t, s, "poison-2", ev("One", hugeNumbers(1)))
	// ... and reads back within it.
	sequenceAll(t, s)
	got, err := s.ReadStream(ctx, "poison-2", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 1)
	require.LessOrEqual(t, len(got[0].Data), eventsource.MaxEventSizeDefault)

	// A small MaxEventSize bounds the text form too; numbers written out
	// in full are counted at their printed length.
	small, err := eventsource.New(s.Pool(), eventsource.Config{Schema: s.Schema(), MaxEventSize: 1000})
	require.NoError(t, err)
	for _, data := range []string{`[1e2000]`, `[1e-2000]`, `{"a":12.5e998}`, `[-1.5E+999]`} {
		_, err = small.Append(ctx, "poison-3", eventsource.Any, []eventsource.EventData{ev("Big", data)})
		require.ErrorAs(t, err, &evErr, data)
		require.Equal(t, 0, evErr.Index)
	}
	for _, data := range []string{`[1e900]`, `[1e-900]`, `[0e100000]`, `[1.5, 2e3, -0.25E-2, 0]`} {
		_, err = small.Append(ctx, "poison-3", eventsource.Any, []eventsource.EventData{ev("Fits", data)})
		require.NoError(t, err, data)
	}
	sequenceAll(t, s)
	got, err = small.ReadStream(ctx, "poison-3", 0, 0)
	require.NoError(t, err)
	for _, e := range got {
		require.LessOrEqual(t, len(e.Data), 1000, "%s reads back within MaxEventSize", e.Data)
	}
}

// insertPoison writes, through SQL (as an older version or a DBA could),
// an event whose text form exceeds PostgreSQL's 1 GB limit: every read that
// returns it fails with "out of memory" (54000).
func insertPoison(t *testing.T, s *eventsource.Store, stream string, version int64) uuid.UUID {
	t.Helper()
	sn, err := eventsource.ParseStreamName(stream)
	require.NoError(t, err)
	id := uuid.New()
	_, err = s.Pool().Exec(context.Background(), fmt.Sprintf(`INSERT INTO %[1]s.events
(event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT $1, $2, $3, $4, %[1]s.cg_hash($4), $5, 'Poison', jsonb_agg('1e131071'::numeric) FROM generate_series(1, 8300)`,
		s.QuotedSchema()), id, stream, sn.Category, sn.CardinalID, version)
	require.NoError(t, err)
	_, err = s.Pool().Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s.streams (stream_name, version) VALUES ($1, $2)
ON CONFLICT (stream_name) DO UPDATE SET version = excluded.version`, s.QuotedSchema()), stream, version)
	require.NoError(t, err)
	return id
}

func TestReadsIsolateAnUnreadableEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	mustAppend(t, s, "sick-1", ev("Before", `{"n":1}`))
	mustAppend(t, s, "well-1", ev("Other", `{"n":2}`))
	bad := insertPoison(t, s, "sick-1", 1)
	mustAppend(t, s, "sick-1", ev("After", `{"n":3}`))
	mustAppend(t, s, "sick-2", ev("After", `{"n":4}`))
	sequenceAll(t, s)

	check := func(what string, events []eventsource.RecordedEvent, err error, want int) {
		t.Helper()
		require.NoError(t, err, what)
		require.Len(t, events, want, what)
		found := false
		for i, e := range events {
			if i > 1 {
				// The order of the read holds around the unreadable event.
				require.Equal(t, events[1].Position > events[0].Position, e.Position > events[i-1].Position, what)
			}
			if e.ID != bad {
				require.NoError(t, e.Err, what)
				require.NotEmpty(t, e.Data, what)
				continue
			}
			found = true
			var unreadable *eventsource.UnreadableEventError
			require.ErrorAs(t, e.Err, &unreadable, what)
			require.True(t, errors.Is(e.Err, eventsource.ErrUnreadableEvent), what)
			require.Equal(t, bad, unreadable.EventID, what)
			require.Equal(t, "sick-1", unreadable.Stream, what)
			require.Equal(t, e.Position, unreadable.Position, what)
			require.Contains(t, unreadable.Error(), "54000", what)
			require.Equal(t, "sick-1", e.Stream, what)
			require.Equal(t, "Poison", e.Type, what)
			require.Nil(t, e.Data, what)
		}
		require.True(t, found, "%s returns the unreadable event, marked", what)
	}
	all, err := s.ReadAll(ctx, 0, 100)
	check("ReadAll", all, err, 5)
	cat, err := s.ReadCategory(ctx, "sick", 0, 100)
	check("ReadCategory", cat, err, 4)
	stream, err := s.ReadStream(ctx, "sick-1", 0, 100)
	check("ReadStream", stream, err, 3)
	back, err := s.ReadStreamBackward(ctx, "sick-1", -1, 100)
	check("ReadStreamBackward", back, err, 3)
	bucket := eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, 4)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 4))
	mem, err := s.ReadBucket(ctx, "sick", bucket, 4, 0, 100)
	require.NoError(t, err)
	want := 0
	for _, e := range cat {
		if e.Bucket(4) == bucket {
			want++
		}
	}
	check("ReadBucket", mem, err, want)
}

func TestTextSizeBoundsWhatPostgreSQLPrints(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newStore(t).Pool()
	for _, doc := range []string{
		`{}`, `[]`, `null`, `true`, `"x"`, `0`, `-0`, `-0.0`, `1`, `-1.5`, `12.500`, `1e0`, `1E+2`, `1e-2`, `-1.25e-7`,
		`0.000e5`, `0e-300`, `123.456e2`, `123.456e-2`, `0.0012e3`, `9e99`, `1.5e-324`, `5e-324`,
		`{"a":1,"b":[1,2,{"c":null}]}`, ` { "a" : [ 1 , 2 ] } `, `["\u00e9\ud83d\ude00","\"\\\/\b\f\n\r\t","\u0001\u007f"]`,
		`{"a":1,"a":2}`, `[[[[[]]]],{}]`,
	} {
		var printed int64
		require.NoError(t, pool.QueryRow(ctx, `SELECT octet_length($1::text::jsonb::text)`, doc).Scan(&printed), doc)
		size := eventsource.TextSize([]byte(doc))
		require.GreaterOrEqual(t, size, printed, "%s prints as %d bytes", doc, printed)
		require.LessOrEqual(t, size, printed+int64(len(doc)), "%s: the bound is close", doc)
	}
}
