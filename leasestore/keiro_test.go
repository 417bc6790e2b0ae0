package leasestore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// The behavioural suite. Every test of how a Store behaves runs under every
// lease kind (forEachKind) unless it needs a behaviour only some kinds have:
// then it runs under the kinds whose kindFeatures say so (forKindsWhere),
// as Watermill's pub/sub suite asks each backend for its tests.Features. A
// new kind is one more row of leaseKinds, and runs everything.
//
// What stays tied to one kind is so by nature, not by omission: the
// SessionURL checks of TestSessionReachesThePoolsServerAndDatabase and
// TestPoolerDetection (KindSession's dedicated connection, which KindRow
// does not open), Config validation (TestConfig, per field), and
// TestLifecycle/SnapshotShowsBucketsClaimsAndWorkers, which shows one worker
// of each kind side by side.

// kindFeatures are what a lease kind does beyond the behaviour every kind
// shares.
type kindFeatures struct {
	// sessionEvidence: the kind holds a lock on a dedicated database
	// session (Store.session), and its loss is evidence: a worker whose
	// session is gone counts as dead at the next pass of any other worker,
	// which takes its buckets without waiting for the TTL; EnsureHeld asks
	// the session (a round trip) before it answers.
	sessionEvidence bool
	// sessionless: the kind keeps no state in a server session, so it works
	// through a transaction pooler (the simple protocol, a fresh server
	// session for every transaction).
	sessionless bool
}

// leaseKinds is every lease kind, with its features.
var leaseKinds = []struct {
	kind     Kind
	features kindFeatures
}{
	{KindRow, kindFeatures{sessionless: true}},
	{KindSession, kindFeatures{sessionEvidence: true}},
}

// featuresOf returns kind's features.
func featuresOf(t *testing.T, kind Kind) kindFeatures {
	t.Helper()
	for _, k := range leaseKinds {
		if k.kind == kind {
			return k.features
		}
	}
	t.Fatalf("%v is not in leaseKinds", kind)
	return kindFeatures{}
}

// forEachKind runs one behavioural test once per lease kind, in parallel:
// the suite every kind must pass.
func forEachKind(t *testing.T, test func(t *testing.T, kind Kind)) {
	t.Helper()
	forKindsWhere(t, func(kindFeatures) bool { return true }, test)
}

// forKindsWhere runs test once per lease kind whose features satisfy has,
// in parallel: a behaviour only some kinds have. It fails when no kind has
// it, so that a test cannot quietly run under none.
func forKindsWhere(t *testing.T, has func(kindFeatures) bool, test func(t *testing.T, kind Kind)) {
	t.Helper()
	ran := false
	for _, k := range leaseKinds {
		if !has(k.features) {
			continue
		}
		ran = true
		t.Run(k.kind.String(), func(t *testing.T) {
			t.Parallel()
			test(t, k.kind)
		})
	}
	if !ran {
		t.Fatal("no lease kind has the features this test needs")
	}
}

// The features forKindsWhere selects by.
func withSessionEvidence(f kindFeatures) bool    { return f.sessionEvidence }
func withoutSessionEvidence(f kindFeatures) bool { return !f.sessionEvidence }
func sessionless(f kindFeatures) bool            { return f.sessionless }

func TestEveryKindRunsTheSuite(t *testing.T) {
	t.Parallel()
	// Every kind Config accepts is in leaseKinds, so a new kind cannot be
	// added without running the suite.
	for k := Kind(-1); k <= KindSession+8; k++ {
		err := Config{Schema: "s", Subscription: "orders", Buckets: 1, LeaseOptions: LeaseOptions{Kind: k}}.Validate()
		var ce *kumierr.ConfigError
		if errors.As(err, &ce) && ce.Field == "leasestore.Config.Kind" {
			continue
		}
		require.NoError(t, err)
		featuresOf(t, k)
	}
}

// shortTTL gives a config leases that expire within seconds, with
// a heartbeat long enough for a pass on a loaded test machine.
func shortTTL(c Config) Config {
	c.TTL, c.Heartbeat, c.Margin = 3*time.Second, time.Second, 800*time.Millisecond
	return c
}

// The keiro suite (Keiro.Subscription.Shard), ported, for both kinds.
func TestKeiroSuite(t *testing.T) {
	t.Parallel()

	t.Run("EnsureBucketsIsIdempotentAndSafeConcurrently", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			s := b.open(t, b.config(kind, 16, "a"))
			var wg sync.WaitGroup
			errs := make([]error, 8)
			for i := range errs {
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = s.EnsureBuckets(context.Background()) }()
			}
			wg.Wait()
			for _, err := range errs {
				require.NoError(t, err)
			}
			require.NoError(t, s.EnsureBuckets(context.Background()))
			snap, err := s.Snapshot(context.Background())
			require.NoError(t, err)
			require.Len(t, snap.Buckets, 16)
			for i, bk := range snap.Buckets {
				require.Equal(t, i, bk.Bucket)
				require.Equal(t, 16, bk.BucketCount)
				require.Empty(t, bk.Owner)
				require.Zero(t, bk.Epoch)
			}
		})
	})

	t.Run("AClaimsAllBucketsWhileBGetsNone", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 6, "a"))
			res := pass(t, a)
			require.Equal(t, seq(0, 6), buckets(res.Owned), "alone, A's fair share is everything")
			require.Equal(t, seq(0, 6), buckets(res.Claimed))
			require.Equal(t, 1, res.Live)

			bw := b.open(t, b.config(kind, 6, "b"))
			res = pass(t, bw)
			require.Empty(t, res.Owned, "every bucket is held by a live owner: B only places claims")
			require.Equal(t, 2, res.Live)
			require.Equal(t, 3, res.FairShare)
			require.Len(t, res.Pending, 3, "B claims its share from A's surplus, two-phase")
		})
	})

	t.Run("BClaimsAsBucketsAfterExpiryAndAsRenewThenReturnsNothing", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, shortTTL(b.config(kind, 4, "a")))
			require.Len(t, pass(t, a).Owned, 4)
			// A stops renewing (its session, if any, stays up): only expiry frees its buckets.
			bw := b.open(t, shortTTL(b.config(kind, 4, "b")))
			var got PassResult
			eventually(t, 30*time.Second, func() bool {
				got = pass(t, bw)
				return len(got.Owned) == 4
			}, func() string { return fmt.Sprintf("B never took A's expired buckets: it holds %v", buckets(got.Owned)) })
			for _, tk := range got.Takeovers {
				require.Equal(t, "a", tk.From)
				require.Equal(t, EvidenceExpired, tk.Evidence)
				require.EqualValues(t, 2, tk.Epoch, "a change of owner bumps the epoch")
			}
			res, err := a.Renew(context.Background())
			require.NoError(t, err)
			require.Empty(t, res.Owned)
			require.Equal(t, seq(0, 4), res.Lost)
			require.ErrorIs(t, a.EnsureHeld(0), ErrNotHeld)
		})
	})

	t.Run("RenewReturnsOnlyBucketsStillHeld", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			require.Len(t, pass(t, a).Owned, 4)
			require.NoError(t, a.Release(context.Background(), []int{1, 2}))
			require.ErrorIs(t, a.EnsureHeld(1), ErrNotHeld, "a released bucket is given up at once")
			res, err := a.Renew(context.Background())
			require.NoError(t, err)
			require.Equal(t, []int{0, 3}, buckets(res.Owned))
			require.Empty(t, res.Lost, "released buckets were given up, not lost")
			require.Empty(t, res.Claimed, "Renew never claims")
		})
	})

	t.Run("ReleasedBucketsAreClaimableAtOnce", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a")) // 30s TTL: only the release frees them
			require.Len(t, pass(t, a).Owned, 4)
			bw := b.open(t, b.config(kind, 4, "b"))
			require.NoError(t, a.Release(context.Background(), []int{1, 3}))
			res := pass(t, bw)
			require.Equal(t, []int{1, 3}, buckets(res.Claimed))
			require.Empty(t, res.Takeovers, "a released bucket is free, not taken over")
			for _, l := range res.Claimed {
				require.EqualValues(t, 2, l.Epoch)
			}
		})
	})

	t.Run("FailedPassKeepsPreviousOwnership", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			a := b.open(t, b.config(kind, 4, "a"))
			first := pass(t, a)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := a.Pass(ctx)
			require.Error(t, err)
			require.Equal(t, first.Owned, a.Held(), "a failed pass changes nothing")
			require.NoError(t, a.EnsureHeld(2))
			res := pass(t, a)
			require.Equal(t, buckets(first.Owned), buckets(res.Owned))
			require.Empty(t, res.Lost)
			require.Empty(t, res.Claimed)
		})
	})

	// keiro's ensureShards inserted a new N's rows before it noticed the
	// mismatch; kumi's first worker creates the subscription, and every
	// later one, whatever its Buckets, serves the database's count
	// (docs/design/resize.md: GroupOptions.Buckets once a subscription exists).
	t.Run("AWorkerWithAnotherBucketCountServesTheDatabasesAndWritesNoRows", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := setup(t)
			s4 := b.open(t, b.config(kind, 4, "a"))
			require.NoError(t, s4.EnsureBuckets(context.Background()))
			var logged bytes.Buffer
			cfg := b.config(kind, 8, "b")
			cfg.Logger = slog.New(slog.NewTextHandler(&syncWriter{w: &logged}, nil))
			s8 := b.open(t, cfg)
			_, n := s8.Serving()
			require.Equal(t, 8, n, "before it reads the database, its own count")
			require.NoError(t, s8.EnsureBuckets(context.Background()), "no mismatch error: the database rules")
			gen, n := s8.Serving()
			require.Equal(t, [2]int{0, 4}, [2]int{gen, n}, "the database's count")
			round(t, []*Store{s4, s8})
			res := round(t, []*Store{s4, s8})
			require.Len(t, res[1].Owned, 2, "the 8-bucket worker holds half of the 4 buckets")
			for _, l := range res[1].Owned {
				require.Equal(t, 4, l.Buckets)
				require.Less(t, l.Bucket, 4)
				require.True(t, l.Ready)
			}
			require.Equal(t, 4, res[1].Resize.Buckets)
			var rows, maxBucket int
			require.NoError(t, b.pool.QueryRow(context.Background(),
				"SELECT count(*), max(bucket) FROM "+pgx.Identifier{b.schema, "lease_buckets"}.Sanitize()).Scan(&rows, &maxBucket))
			require.Equal(t, 4, rows)
			require.Equal(t, 3, maxBucket)
			require.Equal(t, 1, strings.Count(logged.String(), "the database's bucket count rules"),
				"one Warn line, however many passes: %s", logged.String())
			require.Contains(t, logged.String(), "configured=8 database=4 generation=0")
		})
	})

	t.Run("FairShareTable", func(t *testing.T) {
		for _, tc := range []struct{ n, live, want int }{
			{6, 3, 2}, {6, 4, 2}, {7, 3, 3}, {4, 0, 4}, {4, -1, 4}, {1, 5, 1}, {1024, 32, 32}, {10, 3, 4},
		} {
			require.Equal(t, tc.want, FairShare(tc.n, tc.live), "FairShare(%d, %d)", tc.n, tc.live)
		}
	})

	t.Run("MissingTablesSuggestMigrate", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			b := &testBundle{pool: pgtest.Pool(t), schema: pgtest.NewSchema(t), sub: "orders"}
			_, err := startedStore(context.Background(), b.pool, b.config(kind, 4, "a"))
			require.Error(t, err)
			require.Contains(t, err.Error(), "run leasestore.Migrate")
			require.False(t, errors.Is(err, ErrNotHeld))
		})
	})
}

// syncWriter serialises writes to w (a logger shared by goroutines).
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
