package eventsource_test

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// invisibles are the characters a terminal or a text layout acts on
// rather than shows: C1 controls and bidirectional formatting.
var invisibles = []string{
	"\u0080", "\u0085", "\u009b", "\u009f", // C1: NEL, CSI
	"\u061c", "\u200e", "\u200f", // arabic letter mark, LRM, RLM
	"\u202a", "\u202b", "\u202c", "\u202d", "\u202e", // embeddings and overrides
	"\u2066", "\u2067", "\u2068", "\u2069", // isolates
}

func TestNamesRefuseC1AndBidiControls(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	for _, c := range invisibles {
		var nameErr *eventsource.NameError
		_, err := s.Append(ctx, "cat-a"+c+"b", eventsource.Any, []eventsource.EventData{ev("A", `{}`)})
		require.ErrorAs(t, err, &nameErr, "stream with %U", []rune(c)[0])
		require.Equal(t, "stream", nameErr.Kind)
		_, err = s.Append(ctx, "cat-1", eventsource.Any, []eventsource.EventData{ev("A"+c, `{}`)})
		require.ErrorIs(t, err, eventsource.ErrInvalidEvent, "event type with %U", []rune(c)[0])
		require.ErrorAs(t, err, &nameErr, "event type with %U", []rune(c)[0])
		require.Equal(t, "event type", nameErr.Kind)
		require.ErrorIs(t, eventsource.ValidateCategory("c"+c+"t"), eventsource.ErrInvalidName, "category with %U", []rune(c)[0])
		require.ErrorIs(t, eventsource.ValidateSubscription("s"+c), eventsource.ErrInvalidName, "subscription with %U", []rune(c)[0])
		require.ErrorAs(t, eventsource.ValidateName("worker", "w"+c, 100), &nameErr, "the exported check, %U", []rune(c)[0])
		require.Equal(t, "worker", nameErr.Kind)
	}
	require.Equal(t, 0, countRows(t, s, "events"))
	// Printable text of any script is fine, and so are joiners.
	for _, ok := range []string{"cat-ünï", "cat-日本", "cat-مرحبا", "cat-👩\u200d💻"} {
		_, err := s.Append(ctx, ok, eventsource.Any, []eventsource.EventData{ev("A", `{}`)})
		require.NoError(t, err, ok)
	}
	require.NoError(t, eventsource.ValidateName("worker", "host-1.pid-42", 100))
	require.ErrorIs(t, eventsource.ValidateName("worker", "w\x1b[2J", 100), eventsource.ErrInvalidName)
	require.ErrorIs(t, eventsource.ValidateName("worker", strings.Repeat("w", 101), 100), eventsource.ErrInvalidName)
}

func TestNameErrorCutsOnACharacter(t *testing.T) {
	t.Parallel()
	// 'é' is two bytes: an odd-length prefix puts byte 80 inside one.
	name := "c-x" + strings.Repeat("é", 300) + "\x01"
	_, err := eventsource.ParseStreamName(name)
	var nameErr *eventsource.NameError
	require.ErrorAs(t, err, &nameErr)
	require.True(t, utf8.ValidString(nameErr.Name), "%q", nameErr.Name)
	require.True(t, strings.HasPrefix(name, strings.TrimSuffix(nameErr.Name, "…")))
	require.LessOrEqual(t, len(nameErr.Name), 80+len("…"))
}

func TestOnlyARealEscapedNULIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	// A backslash followed by u0000 is text jsonb stores fine.
	for _, data := range []string{`{"a":"\\u0000"}`, `["x\\\\u0000"]`, `{"\\u0000":1}`} {
		mustAppend(t, s, "esc-1", ev("Ok", data))
	}
	sequenceAll(t, s)
	got, err := s.ReadStream(ctx, "esc-1", 0, 0)
	require.NoError(t, err)
	require.Len(t, got, 3)
	require.JSONEq(t, `{"a":"\\u0000"}`, string(got[0].Data))
	// A real \u0000, after any number of escaped backslashes, is not.
	for _, data := range []string{`{"a":"\u0000"}`, `["\\\u0000"]`, `["x\\\\\u0000y"]`, `{"\u0000":1}`} {
		_, err := s.Append(ctx, "esc-2", eventsource.Any, []eventsource.EventData{ev("Nul", data)})
		var evErr *eventsource.EventError
		require.ErrorAs(t, err, &evErr, data)
		require.Contains(t, evErr.Reason, `\u0000`)
	}
	e := ev("Meta", `{}`)
	e.Metadata = []byte(`{"a":"\\u0000"}`)
	mustAppend(t, s, "esc-3", e)
}

func TestEverySchemaEntryPointRefusesALongName(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := strings.Repeat("s", 64)
	var cfgErr *kumierr.ConfigError
	_, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: long})
	require.ErrorAs(t, err, &cfgErr)
	require.Equal(t, "eventsource.Config.Schema", cfgErr.Field)
	err = eventsource.Migrate(ctx, pgtest.Pool(t), long)
	require.ErrorAs(t, err, &cfgErr, "Migrate: %v", err)
	require.Equal(t, "eventsource.Config.Schema", cfgErr.Field)
	// 63 bytes of a multi-byte name: PostgreSQL would cut it mid-character.
	err = eventsource.Migrate(ctx, pgtest.Pool(t), strings.Repeat("é", 32))
	require.ErrorAs(t, err, &cfgErr, "Migrate: %v", err)
}
