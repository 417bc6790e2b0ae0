package leasestore

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	t.Parallel()
	b := setup(t)
	a := b.open(t, b.config(KindRow, 8, "a"))
	res := pass(t, a)
	require.Equal(t, seq(0, 8), buckets(res.Owned))
	c := b.open(t, b.config(KindSession, 8, "c"))
	res = pass(t, c)
	t.Logf("%+v", res)
	res = pass(t, a)
	t.Logf("%+v", res)
	for _, bk := range res.HandOff {
		require.NoError(t, a.HandOver(t.Context(), bk))
	}
	res = pass(t, c)
	t.Logf("%+v", res)
	snap, err := a.Snapshot(t.Context())
	require.NoError(t, err)
	t.Logf("%+v", snap)
}
