package eventsource_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// hashVectors pin the consumer-group hash: changing it would move every
// stream to another bucket. Computed independently (Python's hashlib:
// struct.unpack('>q', md5(s).digest()[:8])) and buckets as h mod n.
var hashVectors = []struct {
	cardinal string
	hash     int64
	buckets  [4]int // for groups of 1, 3, 8 and 1000
}{
	{"", -3162216497309240828, [4]int{0, 1, 4, 172}},
	{"0", -3473083983811222033, [4]int{0, 2, 7, 967}},
	{"1", -4266524885998034046, [4]int{0, 0, 2, 954}},
	{"7", -8136627526607169926, [4]int{0, 1, 2, 74}},
	{"42", -6786705937655499993, [4]int{0, 0, 7, 7}},
	{"account", -2132379389342958165, [4]int{0, 0, 3, 835}},
	{"d3b07384", -2948895691832933624, [4]int{0, 1, 0, 376}},
	{"ünïcødé", 2826541790807054415, [4]int{0, 0, 7, 415}},
	{"a b", 921493332900466999, [4]int{0, 1, 7, 999}},
	{"with'quote", 7672868940561902460, [4]int{0, 0, 4, 460}},
	{"x\"; DROP TABLE y; --", -4341336204487134181, [4]int{0, 2, 3, 819}},
	{"0123456789abcdef0123456789abcdef0123456789abcdef", -101803911264138902, [4]int{0, 1, 2, 98}},
}

var vectorGroups = [4]int{1, 3, 8, 1000}

func TestConsumerGroupHash(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("GoMatchesThePinnedVectors", func(t *testing.T) {
		t.Parallel()
		for _, v := range hashVectors {
			require.Equal(t, v.hash, eventsource.Hash(v.cardinal), "Hash(%q)", v.cardinal)
			for i, n := range vectorGroups {
				require.Equal(t, v.buckets[i], eventsource.BucketOfHash(v.hash, n), "BucketOfHash(Hash(%q), %d)", v.cardinal, n)
			}
		}
	})

	t.Run("SQLMatchesThePinnedVectors", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, v := range hashVectors {
			var got int64
			require.NoError(t, s.Pool().QueryRow(ctx, "SELECT "+s.QuotedSchema()+".cg_hash($1)", v.cardinal).Scan(&got))
			require.Equal(t, v.hash, got, "cg_hash(%q)", v.cardinal)
			for i, n := range vectorGroups {
				var m int
				require.NoError(t, s.Pool().QueryRow(ctx, "SELECT "+s.QuotedSchema()+".cg_bucket($1, $2)", v.hash, n).Scan(&m))
				require.Equal(t, v.buckets[i], m, "cg_bucket(cg_hash(%q), %d)", v.cardinal, n)
			}
		}
	})

	t.Run("BucketIsNonNegativeAtTheExtremes", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		for _, h := range []int64{math.MinInt64, math.MinInt64 + 1, -1, 0, 1, math.MaxInt64} {
			for _, n := range []int{1, 2, 3, 7, 8, 64, 1000, math.MaxInt32} {
				m := eventsource.BucketOfHash(h, n)
				require.True(t, m >= 0 && m < n, "BucketOfHash(%d, %d) = %d", h, n, m)
				var sqlM int
				require.NoError(t, s.Pool().QueryRow(ctx, "SELECT "+s.QuotedSchema()+".cg_bucket($1, $2)", h, n).Scan(&sqlM))
				require.Equal(t, m, sqlM, "cg_bucket(%d, %d)", h, n)
			}
		}
	})

	t.Run("StoredHashIsTheCardinalIDs", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "account-7", ev("A", `{}`))
		mustAppend(t, s, "account-7+snapshot", ev("S", `{}`))
		sequenceAll(t, s)
		evs, err := s.ReadCategory(ctx, "account", 0, 0)
		require.NoError(t, err)
		require.Len(t, evs, 2)
		for _, e := range evs {
			require.Equal(t, eventsource.Hash("7"), e.Hash, e.Stream)
		}
		var sqlHash int64
		require.NoError(t, s.Pool().QueryRow(ctx, fmt.Sprintf(
			"SELECT count(*) FROM %[1]s.events WHERE cg_hash <> %[1]s.cg_hash(cardinal_id)", s.QuotedSchema())).Scan(&sqlHash))
		require.Zero(t, sqlHash, "stored hashes equal SQL's cg_hash")
	})
}

func TestConsumerGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)

	// 60 streams of "cg" (some with a "+snapshot" sibling), and noise in
	// another category, appended in an interleaved order.
	var want []uuid.UUID
	for round := range 4 {
		for i := range 60 {
			res := mustAppend(t, s, fmt.Sprintf("cg-%d", i), ev("E", fmt.Sprintf(`{"r":%d}`, round)))
			want = append(want, res.IDs...)
			if i%5 == 0 {
				res = mustAppend(t, s, fmt.Sprintf("cg-%d+snapshot", i), ev("S", `{}`))
				want = append(want, res.IDs...)
			}
			mustAppend(t, s, fmt.Sprintf("other-%d", i), ev("N", `{}`))
		}
	}
	sequenceAll(t, s)

	for _, n := range []int{1, 3, 8} {
		t.Run(fmt.Sprintf("BucketsOfAGroupOf%dPartitionTheCategory", n), func(t *testing.T) {
			t.Parallel()
			require.NoError(t, s.EnsureConsumerGroupIndex(ctx, n))
			owner := map[uuid.UUID]int{}
			streamBucket := map[string]int{}
			for m := range n {
				var after int64
				for {
					page, err := s.ReadBucket(ctx, "cg", m, n, after, 7)
					require.NoError(t, err)
					if len(page) == 0 {
						break
					}
					for _, e := range page {
						require.Greater(t, e.Position, after)
						after = e.Position
						require.Equal(t, "cg", e.Category)
						_, dup := owner[e.ID]
						require.False(t, dup, "event %s read by two buckets", e.ID)
						owner[e.ID] = m
						cardinal, _, _ := strings.Cut(strings.TrimPrefix(e.Stream, "cg-"), "+")
						require.Equal(t, eventsource.BucketOfHash(eventsource.Hash(cardinal), n), m, e.Stream)
						require.Equal(t, m, e.Bucket(n))
						if prev, ok := streamBucket[cardinal]; ok {
							require.Equal(t, prev, m, "stream %s is split between buckets", e.Stream)
						}
						streamBucket[cardinal] = m
					}
				}
			}
			require.Len(t, owner, len(want), "every event of the category in exactly one bucket")
			for _, id := range want {
				require.Contains(t, owner, id)
			}
		})
	}

	t.Run("BucketReadUsesTheConsumerGroupIndex", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		// 500 streams, a third of them in the category, each one append
		// of 60 events, written as the append statement writes them.
		_, err := s.Pool().Exec(ctx, fmt.Sprintf(`
INSERT INTO %[1]s.appends (seq, stream_name, first_version, last_version, category, cg_hash) OVERRIDING SYSTEM VALUE
SELECT k + 1, c || '-' || k, 0, 59, c, %[1]s.cg_hash(k::text)
FROM generate_series(0, 499) AS k, LATERAL (SELECT CASE WHEN k %% 3 = 0 THEN 'cg' ELSE 'noise' END AS c) cat;
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT k + 1, gen_random_uuid(), c || '-' || k, c, k::text, %[1]s.cg_hash(k::text), v, 'E', '{}'
FROM generate_series(0, 499) AS k, generate_series(0, 59) AS v,
  LATERAL (SELECT CASE WHEN k %% 3 = 0 THEN 'cg' ELSE 'noise' END AS c) cat`, s.QuotedSchema()))
		require.NoError(t, err)
		n, err := s.Sequence(ctx)
		require.NoError(t, err)
		require.Equal(t, 30000, n)
		require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 8))
		_, err = s.Pool().Exec(ctx, "ANALYZE "+s.QuotedSchema()+".events, "+s.QuotedSchema()+".appends")
		require.NoError(t, err)
		// A page much smaller than the bucket: an ordered scan of the
		// bucket's part of the index that stops after the page, with no
		// sort of the bucket's rows.
		rows, err := s.Pool().Query(ctx, "EXPLAIN "+s.BucketSQL(8), "cg", 3, 0, 100)
		require.NoError(t, err)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		plan := strings.Join(lines, "\n")
		// The member's ranges from its part of the consumer-group index,
		// each joined to its events through the primary key, sorted only
		// within a range (an incremental sort on the index's order).
		require.Contains(t, plan, "Index Scan using events_cg_8 on appends", "plan:\n%s", plan)
		require.Contains(t, plan, "Index Scan using events_pkey on events", "plan:\n%s", plan)
		require.Contains(t, plan, "Presorted Key: ", "plan:\n%s", plan)
		require.NotRegexp(t, `(?m)(^|->\s+)Sort `, plan, "plan:\n%s", plan)
	})

	t.Run("InvalidBucketsAreRefused", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct{ bucket, size int }{{0, 0}, {-1, 3}, {3, 3}, {0, -1}} {
			_, err := s.ReadBucket(ctx, "cg", c.bucket, c.size, 0, 0)
			require.ErrorIs(t, err, eventsource.ErrInvalidBucket, "bucket %d of %d", c.bucket, c.size)
		}
		var cfgErr *kumierr.ConfigError
		require.ErrorAs(t, s.EnsureConsumerGroupIndex(ctx, 0), &cfgErr)
	})
}

func TestEnsureConsumerGroupIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ManyProcessesAtOnceBuildOneValidIndex", func(t *testing.T) {
		t.Parallel()
		schema := pgtest.NewSchema(t)
		pool := pgtest.NewPool(t, 10)
		first, err := eventsource.New(pool, eventsource.Config{Schema: schema})
		require.NoError(t, err)
		require.NoError(t, first.Migrate(ctx))
		mustAppend(t, first, "g-1", ev("E", `{}`))
		var wg sync.WaitGroup
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := eventsource.New(pool, eventsource.Config{Schema: schema})
				if assertNoError(t, err) {
					assertNoError(t, s.EnsureConsumerGroupIndex(ctx, 5))
				}
			}()
		}
		wg.Wait()
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
			JOIN pg_namespace ns ON ns.oid = c.relnamespace WHERE ns.nspname = $1 AND c.relname = 'events_cg_5' AND i.indisvalid`,
			schema).Scan(&n))
		require.Equal(t, 1, n)
	})

	t.Run("AnInvalidIndexLeftByAnInterruptedBuildIsRebuilt", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		mustAppend(t, s, "g-1", ev("E", `{}`))
		// Fake the leftover of a failed concurrent build.
		_, err := s.Pool().Exec(ctx, fmt.Sprintf(`CREATE INDEX events_cg_4 ON %s.events (category)`, s.QuotedSchema()))
		require.NoError(t, err)
		_, err = s.Pool().Exec(ctx, `UPDATE pg_index SET indisvalid = false WHERE indexrelid = $1::regclass`,
			s.QuotedSchema()+".events_cg_4")
		require.NoError(t, err)
		require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 4))
		var def string
		var valid bool
		require.NoError(t, s.Pool().QueryRow(ctx, `SELECT pg_get_indexdef(indexrelid), indisvalid FROM pg_index WHERE indexrelid = $1::regclass`,
			s.QuotedSchema()+".events_cg_4").Scan(&def, &valid))
		require.True(t, valid)
		require.Contains(t, def, "cg_hash % (4)")
	})
}

func TestBucketLag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	require.NoError(t, s.EnsureConsumerGroupIndex(ctx, 3))
	n, oldest, err := s.BucketLag(ctx, "lag", 0, 3, 0)
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, oldest.IsZero())

	for i := range 30 {
		mustAppend(t, s, fmt.Sprintf("lag-%d", i%6), ev("E", `{}`))
	}
	mustAppend(t, s, "other-1", ev("E", `{}`))
	sequenceAll(t, s)
	evs, err := s.ReadCategory(ctx, "lag", 0, 0)
	require.NoError(t, err)
	for m := range 3 {
		var want []eventsource.RecordedEvent
		for _, e := range evs {
			if e.Bucket(3) == m {
				want = append(want, e)
			}
		}
		n, oldest, err := s.BucketLag(ctx, "lag", m, 3, 0)
		require.NoError(t, err)
		require.Equal(t, int64(len(want)), n, "bucket %d", m)
		if len(want) > 0 {
			require.True(t, oldest.Equal(want[0].RecordedAt))
			n, _, err = s.BucketLag(ctx, "lag", m, 3, want[0].Position)
			require.NoError(t, err)
			require.Equal(t, int64(len(want)-1), n, "behind the first of bucket %d", m)
		}
	}
	_, _, err = s.BucketLag(ctx, "lag", 3, 3, 0)
	require.ErrorIs(t, err, eventsource.ErrInvalidBucket)
}
