package eventsource_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

func TestBadInput(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("InvalidStreamNamesAreRefusedAndNothingIsWritten", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, name := range []string{
			"",
			"nodash",
			"-1",
			"cat-",
			"cat-+snapshot",
			"ca+t-1",
			"cat-1\x00",
			"cat-\x01x",
			"cat-a\nb",
			"cat-a\tb",
			"cat-\x7f",
			" cat-1",
			"cat-1 ",
			"cat-\xff\xfe",
			"cat-" + strings.Repeat("x", eventsource.MaxStreamNameLength),
			strings.Repeat("c", eventsource.MaxCategoryLength+1) + "-1",
		} {
			_, err := s.Append(ctx, name, eventsource.Any, []eventsource.EventData{ev("A", `{}`)})
			require.ErrorIs(t, err, eventsource.ErrInvalidName, "%q", name)
			var nameErr *eventsource.NameError
			require.ErrorAs(t, err, &nameErr, "%q", name)
			require.Equal(t, "stream", nameErr.Kind)
			require.LessOrEqual(t, len(nameErr.Name), 84, "the error quotes a bounded name")

			_, err = s.ReadStream(ctx, name, 0, 0)
			require.ErrorIs(t, err, eventsource.ErrInvalidName, "%q", name)
			_, err = s.ReadStreamBackward(ctx, name, -1, 0)
			require.ErrorIs(t, err, eventsource.ErrInvalidName, "%q", name)
		}
		require.Equal(t, 0, countRows(t, s, "events"))
		require.Equal(t, 0, countRows(t, s, "streams"))
	})

	t.Run("ValidNamesSplitAsDocumented", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct{ name, category, id, cardinal string }{
			{"a-b", "a", "b", "b"},
			{"account-7+snapshot", "account", "7+snapshot", "7"},
			{"order-a-b", "order", "a-b", "a-b"},
			{"kätegorie-ünï", "kätegorie", "ünï", "ünï"},
			{"evil-'); DROP TABLE events; --", "evil", "'); DROP TABLE events; --", "'); DROP TABLE events; --"},
		} {
			sn, err := eventsource.ParseStreamName(c.name)
			require.NoError(t, err, c.name)
			require.Equal(t, eventsource.StreamName{Name: c.name, Category: c.category, ID: c.id, CardinalID: c.cardinal}, sn)
		}
	})

	t.Run("InvalidCategoriesAndSubscriptionsAreRefused", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, c := range []string{"", "a-b", "a+b", "a\x00", strings.Repeat("c", eventsource.MaxCategoryLength+1)} {
			_, err := s.ReadCategory(ctx, c, 0, 0)
			require.ErrorIs(t, err, eventsource.ErrInvalidName, "%q", c)
			_, err = s.ReadBucket(ctx, c, 0, 1, 0, 0)
			require.ErrorIs(t, err, eventsource.ErrInvalidName, "%q", c)
		}
		for _, sub := range []string{"", "a\x00", "a\rb", strings.Repeat("s", eventsource.MaxSubscriptionNameLength+1)} {
			require.ErrorIs(t, eventsource.ValidateSubscription(sub), eventsource.ErrInvalidName, "%q", sub)
		}
	})

	t.Run("InvalidEventsAreRefusedAndNothingIsWritten", func(t *testing.T) {
		t.Parallel()
		s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: pgtest.NewSchema(t), MaxEventSize: 1024, MaxBatchEvents: 5})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		good := ev("Good", `{"ok":true}`)
		withMeta := func(meta string) eventsource.EventData {
			e := ev("Meta", `{}`)
			e.Metadata = json.RawMessage(meta)
			return e
		}
		for _, c := range []struct {
			name  string
			batch []eventsource.EventData
			index int
		}{
			{"EmptyBatch", nil, 0},
			{"TooManyEvents", []eventsource.EventData{good, good, good, good, good, good}, 5},
			{"EmptyType", []eventsource.EventData{good, ev("", `{}`)}, 1},
			{"ControlCharInType", []eventsource.EventData{ev("A\x00B", `{}`)}, 0},
			{"LongType", []eventsource.EventData{ev(strings.Repeat("T", eventsource.MaxEventTypeLength+1), `{}`)}, 0},
			{"EmptyData", []eventsource.EventData{good, ev("A", ``)}, 1},
			{"InvalidJSON", []eventsource.EventData{good, good, ev("A", `{"a":`)}, 2},
			{"TrailingGarbage", []eventsource.EventData{ev("A", `{} x`)}, 0},
			{"NULEscapeInData", []eventsource.EventData{ev("A", `{"a":"\u0000"}`)}, 0},
			{"InvalidUTF8InData", []eventsource.EventData{ev("A", "{\"a\":\"\xff\"}")}, 0},
			{"Oversized", []eventsource.EventData{good, ev("A", `"`+strings.Repeat("x", 1100)+`"`)}, 1},
			{"MetadataNotAnObject", []eventsource.EventData{withMeta(`[1,2]`)}, 0},
			{"MetadataAString", []eventsource.EventData{withMeta(`"traceparent"`)}, 0},
			{"MetadataInvalidJSON", []eventsource.EventData{good, withMeta(`{"a"`)}, 1},
			{"NumberBeyondJSONB", []eventsource.EventData{good, ev("A", `{"n":1e1000000}`)}, 1}, // its text form is over MaxEventSize
		} {
			_, err := s.Append(ctx, "order-1", eventsource.Any, c.batch)
			require.ErrorIs(t, err, eventsource.ErrInvalidEvent, c.name)
			var evErr *eventsource.EventError
			require.ErrorAs(t, err, &evErr, c.name)
			require.Equal(t, c.index, evErr.Index, "%s: %v", c.name, err)
		}
		_, err = s.Append(ctx, "order-1", eventsource.ExpectedVersion(-4), []eventsource.EventData{good})
		require.ErrorIs(t, err, eventsource.ErrInvalidEvent, "an expected version that is no mode")
		require.Equal(t, 0, countRows(t, s, "events"))
		require.Equal(t, 0, countRows(t, s, "streams"))

		// Metadata null is no metadata; an object is kept.
		mustAppend(t, s, "order-2", withMeta(`null`), withMeta(`{"user":"ann"}`))
		got, err := s.ReadStream(ctx, "order-2", 0, 0)
		require.NoError(t, err)
		require.Nil(t, got[0].Metadata)
		require.JSONEq(t, `{"user":"ann"}`, string(got[1].Metadata))
	})

	t.Run("AHostileStreamNameIsStoredLiterally", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		name := `evil-'); DROP TABLE events; --"` + "\u00e9"
		mustAppend(t, s, name, ev("A", `{"x":"'; DROP TABLE streams; --"}`))
		sequenceAll(t, s)
		got, err := s.ReadStream(ctx, name, 0, 0)
		require.NoError(t, err)
		require.Len(t, got, 1)
		require.Equal(t, name, got[0].Stream)
		require.JSONEq(t, `{"x":"'; DROP TABLE streams; --"}`, string(got[0].Data))
		cat, err := s.ReadCategory(ctx, "evil", 0, 0)
		require.NoError(t, err)
		require.Len(t, cat, 1)
		require.Equal(t, 1, countRows(t, s, "streams"))
	})

	t.Run("InvalidConfigIsRefused", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		for name, c := range map[string]struct {
			cfg   eventsource.Config
			field string
		}{
			"LongSchema":         {eventsource.Config{Schema: strings.Repeat("s", 64)}, "eventsource.Config.Schema"},
			"NULInSchema":        {eventsource.Config{Schema: "a\x00b"}, "eventsource.Config.Schema"},
			"SystemSchema":       {eventsource.Config{Schema: "pg_catalog"}, "eventsource.Config.Schema"},
			"SystemPrefix":       {eventsource.Config{Schema: "PG_mine"}, "eventsource.Config.Schema"},
			"InvalidUTF8Schema":  {eventsource.Config{Schema: "a\xffb"}, "eventsource.Config.Schema"},
			"NegativeEventSize":  {eventsource.Config{MaxEventSize: -1}, "eventsource.Config.MaxEventSize"},
			"NegativeBatchLimit": {eventsource.Config{MaxBatchEvents: -1}, "eventsource.Config.MaxBatchEvents"},
		} {
			_, err := eventsource.New(pool, c.cfg)
			var cfgErr *kumierr.ConfigError
			require.ErrorAs(t, err, &cfgErr, name)
			require.Equal(t, c.field, cfgErr.Field, name)
		}
		_, err := eventsource.New(nil, eventsource.Config{})
		var cfgErr *kumierr.ConfigError
		require.ErrorAs(t, err, &cfgErr)
	})
}

// TestHostileSchemaNames runs the whole store in schemas whose names are
// SQL: every identifier is quoted, so they are just names.
func TestHostileSchemaNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	canary := pgtest.NewSchema(t)
	_, err := pgtest.Pool(t).Exec(ctx, "CREATE SCHEMA "+canary+"; CREATE TABLE "+canary+".y (id int)")
	require.NoError(t, err)
	suffix := canary[len(canary)-6:]

	for _, schema := range []string{
		`x"; DROP TABLE ` + canary + `.y; --` + suffix,
		`a$$b'c;` + suffix,
		`Mixed Case "Ünï" ` + suffix,
		`{{schema}}` + suffix,
	} {
		t.Run(schema, func(t *testing.T) {
			t.Parallel()
			t.Cleanup(func() {
				_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
			})
			s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: schema})
			require.NoError(t, err)
			require.NoError(t, s.Migrate(ctx))
			require.NoError(t, s.Migrate(ctx))

			n, err := s.NewNotifier(eventsource.NotifierOptions{PollInterval: -1})
			require.NoError(t, err)
			l, err := n.Listen(s.NotifyChannel())
			require.NoError(t, err)
			startNotifier(t, n)
			drainTick(l)

			res := mustAppend(t, s, "order-1", ev("Placed", `{}`), ev("Paid", `{}`))
			sequenceAll(t, s)
			require.True(t, waitTick(l, 5*time.Second), "notifications on the schema's channel")
			got, err := s.ReadStream(ctx, "order-1", 0, 0)
			require.NoError(t, err)
			require.Len(t, got, 2)
			back, err := s.ReadStreamBackward(ctx, "order-1", -1, 1)
			require.NoError(t, err)
			require.Equal(t, int64(1), back[0].Version)
			all, err := s.ReadAll(ctx, 0, 0)
			require.NoError(t, err)
			require.Len(t, all, 2)
			require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 3))
			m, err := s.ReadBucket(ctx, "order", all[0].Bucket(3), 3, 0, 0)
			require.NoError(t, err)
			require.Len(t, m, 2)
			_, err = s.SaveCheckpoint(ctx, "sub", 0, 2, nil)
			require.NoError(t, err)
			_, err = s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: res.IDs[0], Reason: "x"})
			require.NoError(t, err)
			replayed, err := s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(context.Context, eventsource.RecordedEvent) error { return nil })
			require.NoError(t, err)
			require.Equal(t, 1, replayed)

			var exists bool
			require.NoError(t, pgtest.Pool(t).QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", canary+".y").Scan(&exists))
			require.True(t, exists, "the canary table survived")
		})
	}
}
