package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrNoServerBinaries is returned by [Start] when no PostgreSQL server
// binaries (initdb, postgres) can be found on PATH or under
// /usr/lib/postgresql/*/bin.
var ErrNoServerBinaries = errors.New("pgtest: no PostgreSQL server binaries found (initdb, postgres); " +
	"install them with `apt-get install -y postgresql`, or set DATABASE_URL to an existing database")

// Server is a throwaway PostgreSQL server running in a temporary directory.
// It is started by [Start] and removed, data and all, by [Server.Stop].
type Server struct {
	// URL is a connection string for the server's "postgres" database,
	// with its password when it has one (Options.Password).
	URL string

	binDir  string
	dir     string
	dataDir string
	port    int
	cred    *syscall.Credential
	user    *url.Userinfo
	cmd     *exec.Cmd
	exited  chan struct{}
}

// Options tune a throwaway server. The zero value is fine for tests.
type Options struct {
	// Port to listen on; 0 picks a free one.
	Port int
	// Durable keeps fsync on. Off by default: a throwaway server trades
	// crash safety for speed.
	Durable bool
	// MaxConnections defaults to 400.
	MaxConnections int
	// Password, when not "", is the "postgres" role's password, and every
	// connection, TCP (127.0.0.1) or Unix socket, must give it
	// (scram-sha-256). Empty, the server trusts every local connection as
	// the superuser: fine for tests' throwaway servers, which a test run
	// owns; not for a server that lives while a user does other things
	// (the demo's), where any local process could connect as postgres and
	// run COPY … FROM PROGRAM as the server's OS user.
	Password string
}

// FindBinaries returns the directory holding initdb and postgres: the one on
// PATH first (where a symlink there leads, when that holds postgres too),
// then the newest /usr/lib/postgresql/*/bin.
func FindBinaries() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		// A symlink on PATH (/usr/local/bin/initdb) leads to the directory
		// holding the other tools (pg_basebackup) too.
		if real, err := filepath.EvalSymlinks(p); err == nil {
			if _, err := os.Stat(filepath.Join(filepath.Dir(real), "postgres")); err == nil {
				return filepath.Dir(real), nil
			}
		}
		dir := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(dir, "postgres")); err == nil {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoServerBinaries
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start initialises and starts a throwaway server. As root it runs the server
// as the unprivileged "postgres" user (initdb refuses root). The server dies
// with the calling process even if that process is killed.
func Start(ctx context.Context, opts Options) (*Server, error) {
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	s := &Server{binDir: binDir, port: opts.Port}
	if s.port == 0 {
		if s.port, err = FreePort(); err != nil {
			return nil, fmt.Errorf("pgtest: find a free port: %w", err)
		}
	}
	if s.dir, s.cred, err = ownedTempDir("kumi-pg-"); err != nil {
		return nil, err
	}
	s.dataDir = filepath.Join(s.dir, "data")
	args := []string{"-D", s.dataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--no-sync"}
	if opts.Password != "" {
		pwfile, err := s.writeOwned("pwfile", opts.Password+"\n")
		if err != nil {
			_ = os.RemoveAll(s.dir)
			return nil, err
		}
		defer func() { _ = os.Remove(pwfile) }()
		args = append(args, "-A", "scram-sha-256", "--pwfile", pwfile)
	}
	initdb := exec.CommandContext(ctx, filepath.Join(binDir, "initdb"), args...)
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	initdb.Dir = s.dir
	if out, err := initdb.CombinedOutput(); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, fmt.Errorf("pgtest: initdb: %w\n%s", err, out)
	}
	maxConn := opts.MaxConnections
	if maxConn == 0 {
		maxConn = 400
	}
	conf := []string{
		"listen_addresses = '127.0.0.1'",
		"unix_socket_permissions = 0700",
		fmt.Sprintf("port = %d", s.port),
		fmt.Sprintf("unix_socket_directories = '%s'", s.dir),
		fmt.Sprintf("max_connections = %d", maxConn),
		"shared_buffers = 256MB",
		"synchronous_commit = off",
		"log_min_messages = fatal",
		"max_locks_per_transaction = 256",
		// Commit times, for tests that judge when a change became visible.
		"track_commit_timestamp = on",
	}
	if !opts.Durable {
		conf = append(conf, "fsync = off", "full_page_writes = off")
	}
	if err := appendConf(s.dataDir, conf); err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	s.user = url.User("postgres")
	if opts.Password != "" {
		s.user = url.UserPassword("postgres", opts.Password)
	}
	s.URL = s.urlOf()
	err = s.launch(ctx)
	// A port FreePort chose can still be taken before the server binds it:
	// choose again (a later "port" line in postgresql.conf wins).
	for retries := 0; opts.Port == 0 && errors.Is(err, errPortInUse) && retries < 3; retries++ {
		if s.port, err = FreePort(); err != nil {
			break
		}
		if err = appendConf(s.dataDir, []string{fmt.Sprintf("port = %d", s.port)}); err != nil {
			break
		}
		s.URL = s.urlOf()
		err = s.launch(ctx)
	}
	if err != nil {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	return s, nil
}

// urlOf is the URL of the server's "postgres" database, with the password
// if it has one.
func (s *Server) urlOf() string {
	u := url.URL{Scheme: "postgres", User: s.user, Host: fmt.Sprintf("127.0.0.1:%d", s.port), Path: "/postgres",
		RawQuery: "sslmode=disable"}
	return u.String()
}

// writeOwned writes a file readable by the server's user only, in its
// directory, and returns its path.
func (s *Server) writeOwned(name, content string) (string, error) {
	path := filepath.Join(s.dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return "", fmt.Errorf("pgtest: write %s: %w", name, err)
	}
	if s.cred != nil {
		if err := os.Chown(path, int(s.cred.Uid), int(s.cred.Gid)); err != nil {
			return "", fmt.Errorf("pgtest: chown %s: %w", name, err)
		}
	}
	return path, nil
}

// errPortInUse is wrapped by launch's error when the server could not bind
// its port.
var errPortInUse = errors.New("port in use")

// ownedTempDir makes a temp dir for a server's files. As root it returns the
// credentials of the unprivileged "postgres" user, which owns the dir: the
// server binaries refuse to run as root.
func ownedTempDir(prefix string) (string, *syscall.Credential, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, fmt.Errorf("pgtest: temp dir: %w", err)
	}
	if os.Geteuid() != 0 {
		return dir, nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, errors.New("pgtest: running as root needs an unprivileged \"postgres\" user to run the server " +
			"(`useradd --system postgres`, or install the postgresql package), or set DATABASE_URL")
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if err := os.Chown(dir, uid, gid); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, fmt.Errorf("pgtest: chown temp dir: %w", err)
	}
	return dir, &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// appendConf appends settings to the data directory's postgresql.conf; later
// lines win.
func appendConf(dataDir string, conf []string) error {
	f, err := os.OpenFile(filepath.Join(dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: open postgresql.conf: %w", err)
	}
	_, err = f.WriteString("\n" + strings.Join(conf, "\n") + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: write postgresql.conf: %w", err)
	}
	return nil
}

func (s *Server) launch(ctx context.Context) error {
	cmd := exec.Command(filepath.Join(s.binDir, "postgres"), "-D", s.dataDir)
	// SIGQUIT is PostgreSQL's immediate shutdown; Pdeathsig makes the
	// server follow its parent when the parent is killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	logf, err := os.Create(filepath.Join(s.dir, "server.log"))
	if err != nil {
		return fmt.Errorf("pgtest: server log: %w", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("pgtest: start postgres: %w", err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(s.exited) }()

	deadline := time.Now().Add(60 * time.Second)
	for {
		select {
		case <-s.exited:
			log, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
			if strings.Contains(string(log), "could not bind") || strings.Contains(string(log), "already in use") ||
				strings.Contains(string(log), "could not create any TCP/IP sockets") {
				return fmt.Errorf("pgtest: port %d: %w; choose another or set DATABASE_URL", s.port, errPortInUse)
			}
			return fmt.Errorf("pgtest: postgres exited during start-up:\n%s", log)
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgx.Connect(cctx, s.URL)
		cancel()
		if err == nil {
			_ = conn.Close(ctx)
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.kill()
			return fmt.Errorf("pgtest: postgres did not accept connections: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGINT) // fast shutdown
	select {
	case <-s.exited:
	case <-time.After(20 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
}

// Kill kills the server's process group at once (kill -9), as a crash of
// its machine would: no shutdown checkpoint, nothing more sent to its
// standbys. Stop still removes its directory.
func (s *Server) Kill() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.exited
}

// Port returns the TCP port the server listens on.
func (s *Server) Port() int { return s.port }

// Restart stops the server (fast shutdown: every session is cut) and starts
// it again on the same port and data directory.
func (s *Server) Restart(ctx context.Context) error {
	s.kill()
	return s.launch(ctx)
}

// Stop shuts the server down and removes its directory.
func (s *Server) Stop() {
	s.kill()
	_ = os.RemoveAll(s.dir)
}
