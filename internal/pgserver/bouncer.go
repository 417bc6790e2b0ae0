package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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

	port int
	dir  string
	bin  string
	cred *syscall.Credential

	mu       sync.Mutex
	cmd      *exec.Cmd // the process running now
	stopping bool
	crashes  atomic.Int64
	down     atomic.Bool   // crashed, and not yet accepting connections again
	exited   chan struct{} // closed once the bouncer is down for good
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

	b.bin, b.cred, b.exited = bin, cred, make(chan struct{})
	cmd, err := b.spawn()
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	b.cmd = cmd
	go b.supervise()

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
	if b.crashes.Load() > 0 || b.Exited() {
		log, _ := os.ReadFile(filepath.Join(dir, "stderr.log"))
		b.Stop()
		return nil, fmt.Errorf("pgtest: pgbouncer exited during start-up:\n%s", log)
	}
	if !ready || lastErr != nil {
		b.Stop()
		return nil, fmt.Errorf("pgtest: pgbouncer did not pass a query within 30s: %v", lastErr)
	}
	return b, nil
}

// spawn starts a pgbouncer process on the bouncer's files.
func (b *Bouncer) spawn() (*exec.Cmd, error) {
	cmd := exec.Command(b.bin, filepath.Join(b.dir, "pgbouncer.ini"))
	// SIGTERM is pgbouncer's immediate shutdown.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: b.cred, Pdeathsig: syscall.SIGTERM, Setpgid: true}
	out, err := os.OpenFile(filepath.Join(b.dir, "stderr.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("pgtest: pgbouncer log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("pgtest: start pgbouncer: %w", err)
	}
	return cmd, nil
}

// supervise waits for the bouncer's process to end and, unless Stop asked
// for it, starts it again on the same port and files, as a service
// manager would (Restart=always): PgBouncer 1.18, Debian 12's, exits with
// "FATAL ... disconnect_client(): bad client state: 0" when a client
// closes a cancel request's connection before PgBouncer has sent it on —
// pgx does, when the statement ends first (pgbouncer/pgbouncer#801). Each
// such end counts in Crashes; its log stays in the files.
func (b *Bouncer) supervise() {
	defer close(b.exited)
	for {
		b.mu.Lock()
		cmd := b.cmd
		b.mu.Unlock()
		_ = cmd.Wait()
		if f, ok := cmd.Stdout.(*os.File); ok {
			_ = f.Close()
		}
		b.mu.Lock()
		if b.stopping {
			b.mu.Unlock()
			return
		}
		b.down.Store(true)
		b.crashes.Add(1)
		var err error
		for range 50 {
			if cmd, err = b.spawn(); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond) // the port may not be free yet
		}
		if err != nil {
			b.mu.Unlock()
			return
		}
		b.cmd = cmd
		b.mu.Unlock()
		b.waitListening()
	}
}

// waitListening clears down once the bouncer's port accepts a connection
// (within 10 s).
func (b *Bouncer) waitListening() {
	WaitFor(10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(b.port), time.Second)
		if err != nil {
			return false
		}
		_ = c.Close()
		return true
	})
	b.down.Store(false)
}

// Down reports whether the bouncer has crashed and does not accept
// connections yet.
func (b *Bouncer) Down() bool { return b.down.Load() }

// Crash kills the bouncer's process (kill -9), as a crash would end it;
// it is started again.
func (b *Bouncer) Crash() {
	b.mu.Lock()
	defer b.mu.Unlock()
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
}

// Crashes counts the times the bouncer's process ended by itself and was
// started again.
func (b *Bouncer) Crashes() int64 { return b.crashes.Load() }

// Port returns the TCP port the bouncer listens on.
func (b *Bouncer) Port() int { return b.port }

// Exited reports whether the bouncer is down for good: stopped, or not
// started again after its process ended.
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
	b.mu.Lock()
	b.stopping = true
	cmd := b.cmd
	b.mu.Unlock()
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-b.exited
	}
	_ = os.RemoveAll(b.dir)
}
