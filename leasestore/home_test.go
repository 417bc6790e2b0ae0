package leasestore

import (
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The lease tables are this package's alone: no other package's code names
// them (tests aside). What an operator reads or changes — ReadSnapshot,
// ListSubscriptions, BucketCount, FenceOut, RequestHandoff — is here,
// with its statements in queries.sql and its tests beside it; a copy
// elsewhere would drift from them unseen.
func TestNoOtherPackageNamesTheLeaseTables(t *testing.T) {
	t.Parallel()
	var found []string
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && path != ".." &&
			(path == filepath.Join("..", "leasestore") || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata"):
			return filepath.SkipDir
		case d.IsDir(), !strings.HasSuffix(path, ".go"), strings.HasSuffix(path, "_test.go"):
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for i, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "lease_buckets") || strings.Contains(line, "lease_members") {
				found = append(found, path+":"+strconv.Itoa(i+1)+": "+strings.TrimSpace(line))
			}
		}
		return nil
	})
	require.NoError(t, err)
	require.Empty(t, found, "a lease table named outside leasestore: give leasestore the operation")
}
