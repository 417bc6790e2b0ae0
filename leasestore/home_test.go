package leasestore

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// The lease tables are this package's alone: no other package's code names
// them (tests aside). What an operator reads or changes — ReadSnapshot,
// ListSubscriptions, BucketCount, FenceOut, RequestHandoff — is here,
// with its statements in queries.sql and its tests beside it; a copy
// elsewhere would drift from them unseen.
func TestNoOtherPackageNamesTheLeaseTables(t *testing.T) {
	t.Parallel()
	found, err := pgtest.SourceLinesOutside("..", filepath.Join("..", "leasestore"), func(line string) bool {
		return strings.Contains(line, "lease_buckets") || strings.Contains(line, "lease_workers") ||
			strings.Contains(line, "lease_members") // its name before migration 0002
	})
	require.NoError(t, err)
	require.Empty(t, found, "a lease table named outside leasestore: give leasestore the operation")
}
