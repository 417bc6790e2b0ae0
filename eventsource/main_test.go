package eventsource_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newStore returns a migrated store in a fresh schema.
func newStore(t testing.TB) *eventsource.Store {
	t.Helper()
	s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: pgtest.NewSchema(t)})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(context.Background()))
	return s
}
