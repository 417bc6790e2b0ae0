package worker

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// With DATABASE_URL set, `demo worker -h` or any bad flag printed the URL,
// password included, as the -database-url flag's default (issue 15).
func TestParseFlagsNeverShowsThePassword(t *testing.T) {
	const url = "postgres://admin:hunter2@127.0.0.1:5432/db"
	t.Setenv("DATABASE_URL", url)
	for _, args := range [][]string{{"-h"}, {"-bogus"}, {"-buckets", "many"}, {"-lease", "lock"}, {"extra", "-h"}} {
		var out strings.Builder
		_, err := ParseFlags(args, &out)
		require.Error(t, err, "%q", args)
		require.NotContains(t, out.String()+err.Error(), "hunter2", "%q", args)
	}
	c, err := ParseFlags(nil, &strings.Builder{})
	require.NoError(t, err)
	require.Equal(t, url, c.DatabaseURL, "DATABASE_URL is still the default")
	c, err = ParseFlags([]string{"-database-url", "postgres://other@h/db"}, &strings.Builder{})
	require.NoError(t, err)
	require.Equal(t, "postgres://other@h/db", c.DatabaseURL)
}
