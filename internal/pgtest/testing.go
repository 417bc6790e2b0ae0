package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/kumi-run/kumi/internal/leaktest"
	"github.com/kumi-run/kumi/internal/pgserver"
)

var (
	mu       sync.Mutex
	server   *Server
	baseURL  string
	poolOnce sync.Once
	pool     *pgxpool.Pool
	poolErr  error
)

// Main runs a package's tests against one PostgreSQL for the whole test
// binary: DATABASE_URL when it is set, otherwise a throwaway server started
// here and stopped afterwards. It fails the run on leaked goroutines. Use it
// from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M, ignore ...goleak.Option) {
	code := run(m, ignore)
	os.Exit(code)
}

func run(m *testing.M, ignore []goleak.Option) int {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		baseURL = url
	} else {
		s, err := Start(context.Background(), Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		mu.Lock()
		server, baseURL = s, s.URL
		mu.Unlock()
		// Examples read the database from the environment, as a user's
		// program would.
		_ = os.Setenv("DATABASE_URL", s.URL)
	}
	code := m.Run()
	if pool != nil {
		pool.Close()
	}
	if s := TestServer(); s != nil {
		s.Stop()
	}
	if code == 0 {
		opts := append(leaktest.Ignore(), ignore...)
		if err := goleak.Find(opts...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			return 1
		}
	}
	return code
}

// URL returns the connection string of the test database.
func URL(t testing.TB) string {
	t.Helper()
	if baseURL == "" {
		t.Fatal("pgtest: no database; call pgtest.Main from TestMain")
	}
	return baseURL
}

// TestServer returns the throwaway server, or nil when the tests run against
// DATABASE_URL (tests that restart the server need the former).
func TestServer() *Server {
	mu.Lock()
	defer mu.Unlock()
	return server
}

// LocalServer returns a server on this machine for a test that needs its
// files or binaries (a replica, a pooler in front of it): the throwaway
// server of the test binary, or — when the tests run against DATABASE_URL —
// a server of the test's own, stopped when the test ends. Give the test's
// pools its URL.
func LocalServer(t testing.TB) *Server {
	t.Helper()
	if s := TestServer(); s != nil {
		return s
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := Start(ctx, Options{MaxConnections: 200})
	if err != nil {
		t.Fatalf("pgtest: start a server of the test's own: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// NewReplica starts a hot standby of s (see [Server.StartReplica]) and
// stops it when the test ends.
func NewReplica(t testing.TB, s *Server) *Replica {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r, err := s.StartReplica(ctx)
	if err != nil {
		t.Fatalf("pgtest: start a replica: %v", err)
	}
	t.Cleanup(r.Stop)
	return r
}

// NewBouncer starts a PgBouncer in pool mode mode in front of s (see
// [Server.StartBouncer]) and stops it when the test ends.
func NewBouncer(t testing.TB, s *Server, mode PoolMode) *Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := s.StartBouncer(ctx, mode)
	if err != nil {
		t.Fatalf("pgtest: start pgbouncer: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("pgtest: pgbouncer (crashed and restarted: %d times; down for good: %v), its log's tail:\n%s",
				b.Crashes(), b.Exited(), b.LogTail(4000))
		}
		b.Stop()
	})
	return b
}

// PoolOn returns a pool of at most maxConns connections on url, closed
// when the test ends.
func PoolOn(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse url: %v", err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(p.Close)
	return p
}

// Pool returns a pool shared by the package's tests. Do not close it.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	poolOnce.Do(func() {
		cfg, err := pgxpool.ParseConfig(URL(t))
		if err != nil {
			poolErr = err
			return
		}
		cfg.MaxConns = 40
		pool, poolErr = pgxpool.NewWithConfig(context.Background(), cfg)
	})
	if poolErr != nil {
		t.Fatalf("pgtest: pool: %v", poolErr)
	}
	return pool
}

// NewPool returns a new pool of its own on the test database, closed when
// the test ends; for tests that play several workers.
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return PoolOn(t, URL(t), maxConns)
}

// NewSchema returns the name of a schema no other test uses, and drops it
// with everything in it when the test ends. The schema itself is not
// created: the code under test creates it when it migrates.
func NewSchema(t testing.TB) string {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "t_" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, baseURL)
		if err != nil {
			return
		}
		defer conn.Close(ctx)
		_, _ = conn.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{name}.Sanitize()+" CASCADE")
	})
	return name
}

// Eventually polls cond every few milliseconds until it returns true, and
// fails the test with msg if that has not happened within timeout.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	if !WaitFor(timeout, cond) {
		t.Fatalf("pgtest: condition not met within %v: "+msg, append([]any{timeout}, args...)...)
	}
}

// WaitFor polls cond with a growing interval (1 ms up to 50 ms) until it
// returns true or timeout passes, and reports whether it did:
// [pgserver.WaitFor].
func WaitFor(timeout time.Duration, cond func() bool) bool { return pgserver.WaitFor(timeout, cond) }
