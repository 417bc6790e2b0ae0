package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// PoolMode is PgBouncer's pool_mode: when it gives a client's server
// connection back to the pool.
type PoolMode string

const (
	// PoolSession pins one server connection to a client until it
	// disconnects: session state (advisory locks, LISTEN, prepared
	// statements) behaves as on a direct connection.
	PoolSession PoolMode = "session"
	// PoolTransaction hands a server connection to a client for one
	// transaction (or one statement outside a transaction) only.
	PoolTransaction PoolMode = "transaction"
)

// BouncerExecMode is the pgx query exec mode the test bouncer's URL sets
// in transaction mode, and the one docs/operations.md gives for PgBouncer
// older than 1.21 (Debian 12's is 1.18). pgx's default prepares a named
// statement on one server connection and, in a later transaction, runs it
// on whichever it gets ("prepared statement ... does not exist").
// "cache_describe" sends each query in one round trip with an unnamed
// statement, encoding the arguments by the parameter types the server
// described once per connection. "exec" and "simple_protocol" also avoid
// named statements but guess parameter types from Go types, and cannot
// encode the []uuid.UUID of a multi-event append.
const BouncerExecMode = "cache_describe"

// ErrNoBouncer is returned by [Server.StartBouncer] when no pgbouncer
// binary is found.
var ErrNoBouncer = errors.New("pgserver: no pgbouncer binary found on PATH or in /usr/sbin; " +
	"install it with `apt-get install -y pgbouncer`")

// Bouncer is a PgBouncer in front of a [Server], listening on a free
// loopback port, with its files in a temp dir. It is started by
// [Server.StartBouncer] and stopped, files and all, by [Bouncer.Stop].
type Bouncer struct {
	// URL connects to the server's "postgres" database through the
	// bouncer. In transaction mode it sets
	// default_query_exec_mode=BouncerExecMode.
	URL string
	// Mode is the bouncer's pool_mode.
	Mode PoolMode

	port   int
	dir    string
	cmd    *exec.Cmd
	exited chan struct{}
}

func findBouncer() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNoBouncer
}

// StartBouncer starts a PgBouncer in pool mode mode in front of s, with
// trust authentication for the "postgres" user, and waits until a query
// goes through it. As root it runs as the "postgres" user (pgbouncer
// refuses root). It dies with the calling process.
func (s *Server) StartBouncer(ctx context.Context, mode PoolMode) (*Bouncer, error) {
	if mode != PoolSession && mode != PoolTransaction {
		return nil, fmt.Errorf("pgtest: pool mode %q; use PoolSession or PoolTransaction", mode)
	}
	bin, err := findBouncer()
	if err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	dir, cred, err := ownedTempDir("kumi-pgbouncer-")
	if err != nil {
		return nil, err
	}
	b := &Bouncer{Mode: mode, port: port, dir: dir}
	ini := strings.Join([]string{
		"[databases]",
		fmt.Sprintf("* = host=127.0.0.1 port=%d", s.port),
		"[pgbouncer]",
		"listen_addr = 127.0.0.1",
		fmt.Sprintf("listen_port = %d", port),
		"unix_socket_dir =",
		"auth_type = trust",
		"auth_file = " + filepath.Join(dir, "users.txt"),
		"pool_mode = " + string(mode),
		"max_client_conn = 1000",
		// Enough server connections that no test waits for one; the
		// server allows 400.
		"default_pool_size = 60",
		"ignore_startup_parameters = extra_float_digits",
		"logfile = " + filepath.Join(dir, "pgbouncer.log"),
		"log_connections = 0",
		// Why each connection closed ("closing because: ..."): a failing
		// test's report prints the log's tail (pgtest.NewBouncer).
		"log_disconnections = 1",
		"",
	}, "\n")
	files := map[string]string{
		"pgbouncer.ini": ini,
		"users.txt":     "\"postgres\" \"\"\n",
	}
	for name, text := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			_ = os.RemoveAll(dir)
			return nil, fmt.Errorf("pgtest: write %s: %w", name, err)
		}
	}
	b.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if mode == PoolTransaction {
		b.URL += "&default_query_exec_mode=" + BouncerExecMode
	}

	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	// SIGTERM is pgbouncer's immediate shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
	out, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pgbouncer log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: start pgbouncer: %w", err)
	}
	b.cmd, b.exited = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); _ = out.Close(); close(b.exited) }()

	var lastErr error
	ready := WaitFor(30*time.Second, func() bool {
		select {
		case <-b.exited:
			return true
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		conn, err := pgx.Connect(cctx, b.URL)
		if err != nil {
			lastErr = err
			return ctx.Err() != nil
		}
		defer conn.Close(context.Background())
		var one int
		lastErr = conn.QueryRow(cctx, "SELECT 1").Scan(&one)
		return lastErr == nil || ctx.Err() != nil
	})
	select {
	case <-b.exited:
		log, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("pgtest: pgbouncer exited during start-up:\n%s", log)
	default:
	}
	if !ready || lastErr != nil {
		b.Stop()
		return nil, fmt.Errorf("pgtest: pgbouncer did not pass a query within 30s: %v", lastErr)
	}
	return b, nil
}

// Port returns the TCP port the bouncer listens on.
func (b *Bouncer) Port() int { return b.port }

// Exited reports whether the bouncer's process has ended.
func (b *Bouncer) Exited() bool {
	select {
	case <-b.exited:
		return true
	default:
		return false
	}
}

// LogTail returns the last max bytes of the bouncer's log and of its
// standard error, for a failing test's report.
func (b *Bouncer) LogTail(max int) string {
	var out strings.Builder
	for _, name := range []string{"pgbouncer.log", "stderr.log"} {
		data, err := os.ReadFile(filepath.Join(b.dir, name))
		if err != nil {
			continue
		}
		if len(data) > max {
			data = data[len(data)-max:]
		}
		fmt.Fprintf(&out, "--- %s:\n%s", name, data)
	}
	return out.String()
}

// Stop shuts the bouncer down (every client connection is cut) and removes
// its files.
func (b *Bouncer) Stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
		<-b.exited
	}
	_ = os.RemoveAll(b.dir)
}
