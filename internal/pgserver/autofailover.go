package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// AutoFailover is a pg_auto_failover formation, as a real HA manager runs
// one: a monitor and two PostgreSQL nodes, each run by its own pg_autoctl
// keeper, the second a synchronous standby of the first (pg_auto_failover's
// default with two nodes: synchronous_standby_names = 'ANY 1 (…)'). The
// monitor promotes the standby when the primary fails its health checks,
// or when told (PerformFailover). Its timings are made short for tests:
// a dead primary is given up after a few seconds.
type AutoFailover struct {
	dir, binDir, autoctl string
	cred                 *syscall.Credential
	env                  []string
	monitorPort          int
	nodes                []*afNode
	monitor              *afNode
}

// afNode is one pg_autoctl keeper and the postgres it runs.
type afNode struct {
	name   string
	port   int
	cmd    *exec.Cmd
	exited chan struct{}
}

// FindAutoctl returns the pg_autoctl binary, or an error saying how to
// install it.
func FindAutoctl(binDir string) (string, error) {
	if p := filepath.Join(binDir, "pg_autoctl"); fileExists(p) {
		return p, nil
	}
	if p, err := exec.LookPath("pg_autoctl"); err == nil {
		return p, nil
	}
	return "", errors.New("pgserver: pg_autoctl (pg_auto_failover) is not installed: " +
		"apt-get install postgresql-" + strconv.Itoa(versionOf(binDir)) + "-auto-failover (tools/deps.sh test does it)")
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// StartAutoFailover starts a monitor and two nodes on free loopback ports
// and waits until node_1 is primary and node_2 its synchronous secondary.
func StartAutoFailover(ctx context.Context) (*AutoFailover, error) {
	binDir, err := FindBinaries()
	if err != nil {
		return nil, err
	}
	autoctl, err := FindAutoctl(binDir)
	if err != nil {
		return nil, err
	}
	dir, cred, err := ownedTempDir("kumi-paf-")
	if err != nil {
		return nil, err
	}
	f := &AutoFailover{dir: dir, binDir: binDir, autoctl: autoctl, cred: cred}
	f.env = append(os.Environ(), "PATH="+binDir+":/usr/local/bin:/usr/bin:/bin",
		"XDG_CONFIG_HOME="+filepath.Join(dir, "config"), "XDG_DATA_HOME="+filepath.Join(dir, "data"),
		"XDG_RUNTIME_DIR="+filepath.Join(dir, "run"), "PGCONNECT_TIMEOUT=5")
	ok := false
	defer func() {
		if !ok {
			f.Stop()
		}
	}()
	if f.monitorPort, err = FreePort(); err != nil {
		return nil, err
	}
	// The monitor has no --listen: it listens on every interface, but its
	// pg_hba.conf lets only loopback in (--hostname 127.0.0.1).
	f.monitor, err = f.keeper(ctx, "monitor", f.monitorPort, "create", "monitor")
	if err != nil {
		return nil, err
	}
	if err := f.waitMonitor(ctx); err != nil {
		return nil, err
	}
	// Timings shorter than the defaults (5 s checks, 20 s to unhealthy,
	// 30 s to demote), with room for a loaded machine: a node is checked
	// every second with 2 s to answer, a primary that fails its checks
	// for 5 s is given up, and promotion waits up to 10 s for the old
	// primary to demote itself. (At 1 s, 2 s and 3 s, a machine at load
	// 20 saw nodes marked unhealthy while they ran.)
	for _, set := range []string{"health_check_period = 1000", "health_check_timeout = 2000",
		"health_check_max_retries = 2", "health_check_retry_delay = 500", "node_considered_unhealthy_timeout = 5000",
		"startup_grace_period = 5000", "primary_demote_timeout = 10000"} {
		if err := f.monitorExec(ctx, "ALTER SYSTEM SET pgautofailover."+set); err != nil {
			return nil, err
		}
	}
	if err := f.monitorExec(ctx, "SELECT pg_reload_conf()"); err != nil {
		return nil, err
	}
	for i := 1; i <= 2; i++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		name := "node_" + strconv.Itoa(i)
		n, err := f.keeper(ctx, name, port, "create", "postgres", "--name", name, "--listen", "127.0.0.1",
			"--monitor", f.monitorURL("autoctl_node", "pg_auto_failover"))
		if err != nil {
			return nil, err
		}
		f.nodes = append(f.nodes, n)
		want := map[string]string{"node_1": "single"}
		if i == 2 {
			want = map[string]string{"node_1": "primary", "node_2": "secondary"}
		}
		if err := f.waitStates(ctx, 2*time.Minute, want); err != nil {
			return nil, err
		}
	}
	ok = true
	return f, nil
}

// keeper starts `pg_autoctl <args> --run` for one node in its own process
// group, logging to <name>.log.
func (f *AutoFailover) keeper(ctx context.Context, name string, port int, args ...string) (*afNode, error) {
	args = append(args, "--pgdata", filepath.Join(f.dir, name), "--pgport", strconv.Itoa(port),
		"--hostname", "127.0.0.1", "--auth", "trust", "--no-ssl", "--run")
	cmd := exec.Command(f.autoctl, args...)
	cmd.Dir = f.dir
	cmd.Env = f.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	logf, err := os.Create(filepath.Join(f.dir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("pgserver: %s log: %w", name, err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("pgserver: start pg_autoctl for %s: %w", name, err)
	}
	n := &afNode{name: name, port: port, cmd: cmd, exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); _ = logf.Close(); close(n.exited) }()
	return n, ctx.Err()
}

func (f *AutoFailover) monitorURL(user, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=5", user, f.monitorPort, db)
}

func (f *AutoFailover) monitorExec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, f.monitorURL("postgres", "pg_auto_failover"))
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	_, err = conn.Exec(ctx, sql)
	return err
}

func (f *AutoFailover) waitMonitor(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := f.monitorExec(ctx, "SELECT count(*) FROM pgautofailover.node")
		if err == nil {
			return nil
		}
		select {
		case <-f.monitor.exited:
			return fmt.Errorf("pgserver: the pg_auto_failover monitor exited:\n%s", f.Log("monitor"))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgserver: the pg_auto_failover monitor did not answer: %w\n%s", err, f.Log("monitor"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// States returns each node's reported and goal state, "primary/primary"
// say, by name, as the monitor has them.
func (f *AutoFailover) States(ctx context.Context) (map[string]string, error) {
	conn, err := pgx.Connect(ctx, f.monitorURL("postgres", "pg_auto_failover"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	out := map[string]string{}
	rows, _ := conn.Query(ctx, `SELECT nodename, reportedstate::text || '/' || goalstate::text FROM pgautofailover.node`)
	var name, st string
	_, err = pgx.ForEachRow(rows, []any{&name, &st}, func() error { out[name] = st; return nil })
	return out, err
}

// Events returns the monitor's event log (pgautofailover.event), oldest
// first, one line per event: when, the node, its reported and assigned
// state, and the monitor's description. A test that judges durability
// reads it to tell when the formation ran without a synchronous standby
// (wait_primary).
func (f *AutoFailover) Events(ctx context.Context) ([]Event, error) {
	conn, err := pgx.Connect(ctx, f.monitorURL("postgres", "pg_auto_failover"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(context.Background()) }()
	rows, _ := conn.Query(ctx, `SELECT eventtime, nodename, reportedstate::text, goalstate::text, description
		FROM pgautofailover.event ORDER BY eventid`)
	var out []Event
	var e Event
	_, err = pgx.ForEachRow(rows, []any{&e.At, &e.Node, &e.Reported, &e.Goal, &e.Description}, func() error {
		out = append(out, e)
		return nil
	})
	return out, err
}

// Event is one entry of the monitor's event log.
type Event struct {
	At             time.Time
	Node           string
	Reported, Goal string
	Description    string
}

// String is the event as one line.
func (e Event) String() string {
	return fmt.Sprintf("%s %s %s/%s %s", e.At.Format("15:04:05.000"), e.Node, e.Reported, e.Goal, e.Description)
}

// waitStates waits until every node named in want reports, and is
// assigned, the state it maps to.
func (f *AutoFailover) waitStates(ctx context.Context, timeout time.Duration, want map[string]string) error {
	deadline := time.Now().Add(timeout)
	var last map[string]string
	var err error
	for {
		last, err = f.States(ctx)
		done := err == nil
		for n, st := range want {
			done = done && last[n] == st+"/"+st
		}
		if done {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("pgserver: pg_auto_failover did not reach %v (last %v, %v); node logs:\n%s", want, last, err,
				f.Log("node_1")+f.Log("node_2"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// URL is a multi-host URL on both nodes that reaches whichever is primary
// (target_session_attrs=read-write), as a worker given it would.
func (f *AutoFailover) URL() string {
	hosts := make([]string, len(f.nodes))
	for i, n := range f.nodes {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(n.port)
	}
	return "postgres://postgres@" + strings.Join(hosts, ",") + "/postgres?sslmode=disable&target_session_attrs=read-write"
}

// Primary returns the name of the node the monitor has as primary.
func (f *AutoFailover) Primary(ctx context.Context) (string, error) {
	st, err := f.States(ctx)
	if err != nil {
		return "", err
	}
	for n, s := range st {
		if s == "primary/primary" || strings.HasPrefix(s, "wait_primary/") {
			return n, nil
		}
	}
	return "", fmt.Errorf("pgserver: no primary in %v", st)
}

// PerformFailover asks the monitor for a failover (a planned switchover:
// the primary is demoted, the secondary promoted) and waits until the
// other node is primary.
func (f *AutoFailover) PerformFailover(ctx context.Context) (newPrimary string, err error) {
	old, err := f.Primary(ctx)
	if err != nil {
		return "", err
	}
	// The monitor refuses a failover without a healthy secondary; on a
	// loaded machine the secondary can be marked unhealthy for a while
	// and come back. Ask once both nodes are settled, and again while the
	// refusals last up to 2 minutes.
	other := map[string]string{old: "primary"}
	for _, n := range f.nodes {
		if n.name != old {
			other[n.name] = "secondary"
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if err := f.waitStates(ctx, time.Until(deadline), other); err != nil {
			return "", err
		}
		cmd := exec.CommandContext(ctx, f.autoctl, "perform", "failover", "--pgdata", filepath.Join(f.dir, "monitor"))
		cmd.Dir, cmd.Env = f.dir, f.env
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: f.cred}
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		// A failure after the failover began (pg_autoctl stops waiting
		// for it after 60 s) leaves it to finish: wait for it below.
		if st, _ := f.States(ctx); st[old] != "primary/primary" {
			break
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("pgserver: pg_autoctl perform failover: %w\n%s", err, out)
		}
	}
	return f.waitOther(ctx, old)
}

// KillPrimary kills the primary's keeper and its postgres at once (kill
// -9 of the process group), as the death of its machine would, and waits
// until the monitor has promoted the other node.
func (f *AutoFailover) KillPrimary(ctx context.Context) (newPrimary string, err error) {
	old, err := f.Primary(ctx)
	if err != nil {
		return "", err
	}
	for _, n := range f.nodes {
		if n.name == old {
			_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
			<-n.exited
		}
	}
	return f.waitOther(ctx, old)
}

// waitOther waits until a node other than old is primary: primary, or
// wait_primary (no standby to wait for), reported and assigned.
func (f *AutoFailover) waitOther(ctx context.Context, old string) (string, error) {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		st, err := f.States(ctx)
		for n, s := range st {
			if n != old && (s == "primary/primary" || s == "wait_primary/wait_primary") {
				return n, nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return "", fmt.Errorf("pgserver: no node took over from %s (states %v, %v); logs:\n%s", old, st, err,
				f.Log("monitor")+f.Log("node_1")+f.Log("node_2"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Log returns the last 4 kB of a keeper's log ("monitor", "node_1", …).
func (f *AutoFailover) Log(name string) string {
	b, _ := os.ReadFile(filepath.Join(f.dir, name+".log"))
	if len(b) > 4096 {
		b = b[len(b)-4096:]
	}
	return "--- " + name + ".log\n" + string(b)
}

// Stop stops every keeper (they stop their postgres), kills what is left
// after 20 s, and removes the formation's directory.
func (f *AutoFailover) Stop() {
	all := append([]*afNode{}, f.nodes...)
	if f.monitor != nil {
		all = append(all, f.monitor)
	}
	for _, n := range all {
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGTERM)
	}
	for _, n := range all {
		select {
		case <-n.exited:
		case <-time.After(20 * time.Second):
		}
		_ = syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL)
		<-n.exited
	}
	_ = os.RemoveAll(f.dir)
}
