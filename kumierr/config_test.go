package kumierr_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/kumierr"
)

func TestConfigError(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  *kumierr.ConfigError
		want string
	}{
		{"NamesTheFieldAndItsValue", &kumierr.ConfigError{Field: "leasestore.Config.TTL", Value: time.Second, Reason: "must be at least 250ms"},
			"kumi: invalid leasestore.Config.TTL = 1s: must be at least 250ms"},
		{"QuotesAString", &kumierr.ConfigError{Field: "actors.GroupOptions.Category", Value: "a-b", Reason: "must not contain '-'"},
			`kumi: invalid actors.GroupOptions.Category = "a-b": must not contain '-'`},
		{"ShowsNoValueWhenThereIsNone", &kumierr.ConfigError{Field: "console.Options.Token", Reason: "must be at least 32 bytes"},
			"kumi: invalid console.Options.Token: must be at least 32 bytes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, c.want, c.err.Error())
			var ce *kumierr.ConfigError
			require.ErrorAs(t, fmt.Errorf("start: %w", c.err), &ce)
			require.Equal(t, c.err, ce)
			var marker interface{ ConfigError() bool }
			require.True(t, errors.As(c.err, &marker) && marker.ConfigError())
		})
	}
}

// Err is what errors.Is finds, and is not repeated in the message.
func TestConfigErrorWrapsItsSentinel(t *testing.T) {
	t.Parallel()
	errMismatch := errors.New("not a standby")
	err := fmt.Errorf("read: %w", &kumierr.ConfigError{Field: "eventsource standby", Reason: "its database is \"b\", the primary's \"a\"", Err: errMismatch})
	require.ErrorIs(t, err, errMismatch)
	require.Equal(t, `read: kumi: invalid eventsource standby: its database is "b", the primary's "a"`, err.Error())
	require.NotErrorIs(t, &kumierr.ConfigError{Field: "f", Reason: "r"}, errMismatch)
}
