package inspect

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConnectPoolNeverRepeatsAPassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"postgres://admin:hunter2@127.0.0.1:notaport/db", `invalid port ":notaport" after host`},
		{"postgres://admin:hunter2@127.0.0.1:5432/db?sslmode=sometimes", "sslmode"},
		{"host=127.0.0.1 port=x user=admin password=hunter2", "not a valid PostgreSQL connection string"},
		{"", "no database"},
	} {
		_, err := ConnectPool(context.Background(), c.url, 1)
		require.Error(t, err, c.url)
		require.Contains(t, err.Error(), c.want)
		require.NotContains(t, err.Error(), "hunter2")
	}
}

func TestRedactURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:xxxxx@h/db and password=xxxxx",
		RedactURL("postgres://u:hunter2@h/db and password=hunter2"))
}
