package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// TestHashMatchesSQL is the database half of test/fuzz's FuzzHash: for a
// table of cardinal ids — the fuzz seeds among them — and group sizes, the
// Go hash and bucket equal the SQL cg_hash and cg_bucket of a migrated
// store, which a bucket read relies on.
func TestHashMatchesSQL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	schema := pgtest.NewSchema(t)
	pool := pgtest.NewPool(t, 2)
	if err := eventsource.Migrate(ctx, pool, schema); err != nil {
		t.Fatal(err)
	}
	ids := []string{"", "0", "1", "7", "42", "account", "account-7", "7+snapshot", "ünïcödé", "日本語", "a b",
		"-", "+", "--", strings.Repeat("x", 500), "\u00a0", "emoji-🙂", "9223372036854775807"}
	for i := range 200 {
		ids = append(ids, fmt.Sprintf("id-%d", i), fmt.Sprintf("%x", i*7919))
	}
	sizes := []int{1, 2, 3, 4, 7, 8, 16, 31, 32, 100, 1000, 1024, 4096, 65536}
	q := pgx.Identifier{schema}.Sanitize()
	rows, err := pool.Query(ctx, fmt.Sprintf(`SELECT id, n, %[1]s.cg_hash(id), %[1]s.cg_bucket(%[1]s.cg_hash(id), n)
		FROM unnest($1::text[]) AS id, unnest($2::int[]) AS n`, q), ids, sizes)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	var id string
	var n, bucket int
	var hash int64
	_, err = pgx.ForEachRow(rows, []any{&id, &n, &hash, &bucket}, func() error {
		checked++
		if got := eventsource.Hash(id); got != hash {
			t.Errorf("Hash(%q) = %d, SQL cg_hash = %d", id, got, hash)
		}
		if got := eventsource.BucketOfHash(eventsource.Hash(id), n); got != bucket {
			t.Errorf("BucketOfHash(Hash(%q), %d) = %d, SQL cg_bucket = %d", id, n, got, bucket)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked != len(ids)*len(sizes) {
		t.Fatalf("checked %d pairs, want %d", checked, len(ids)*len(sizes))
	}
}
