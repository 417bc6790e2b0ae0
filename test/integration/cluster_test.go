package integration

import (
	"bufio"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// clusterConfig is what every worker process of a scenario shares.
type clusterConfig struct {
	URL string // the database, direct
	// WorkerURL, when set, is the workers' database instead of URL (a
	// pooler in front of it, say); the harness keeps URL.
	WorkerURL string
	// NoListen runs the workers without the lease store's LISTEN.
	NoListen     bool
	Schema       string
	Subscription string
	Category     string
	Buckets      int
	Kind         leasestore.Kind
	Lease        leaseTimings
	// HandlerDelay, QueueCapacity and Exactly are passed to every worker.
	HandlerDelay  time.Duration
	QueueCapacity int
	Exactly       bool
	// PoolConns sizes each worker's pool (0: the worker's default).
	PoolConns int
	// Extra are more worker flags (internal/worker's), passed as they are.
	Extra []string
}

// cluster runs worker processes: one slot ("w1", "w2", …) per worker, each
// slot a sequence of incarnations with fresh worker ids ("w1.1", "w1.2"),
// as a real deployment restarts a crashed process under a new id.
type cluster struct {
	t      testing.TB
	cfg    clusterConfig
	logDir string

	mu    sync.Mutex
	slots map[string]*proc // the current incarnation of each slot
	incs  map[string]int
	all   []*proc
}

// proc is one worker process.
type proc struct {
	slot, id    string
	cmd         *exec.Cmd
	started     time.Time
	metricsAddr string
	logPath     string
	proxy       *proxy // non-nil when the worker reaches the database through one
	exited      chan struct{}

	mu       sync.Mutex
	expected bool // the harness killed or stopped it
	paused   bool // SIGSTOPped
	cut      bool // its proxy cuts it off
	exitErr  error
}

func newCluster(t testing.TB, cfg clusterConfig) *cluster {
	logDir := t.TempDir()
	if d := os.Getenv("KUMI_CHAOS_LOGS"); d != "" {
		logDir = filepath.Join(d, strings.ReplaceAll(t.Name(), "/", "_"))
		_ = os.MkdirAll(logDir, 0o755)
	}
	c := &cluster{t: t, cfg: cfg, logDir: logDir, slots: map[string]*proc{}, incs: map[string]int{}}
	t.Cleanup(c.shutdown)
	return c
}

// startOpts vary one incarnation.
type startOpts struct {
	viaProxy bool   // reach the database through a proxy the harness can cut
	user     string // connect as this role instead of the URL's
}

// start starts a new incarnation of slot and returns it at once (it joins
// the group within moments; see observer.waitFairSplit).
func (c *cluster) start(slot string, o startOpts) *proc {
	c.t.Helper()
	c.mu.Lock()
	if old := c.slots[slot]; old != nil && old.running() {
		c.mu.Unlock()
		c.t.Fatalf("cluster: slot %s is still running as %s", slot, old.id)
	}
	c.incs[slot]++
	id := fmt.Sprintf("%s.%d", slot, c.incs[slot])
	c.mu.Unlock()

	p := &proc{slot: slot, id: id, exited: make(chan struct{})}
	dbURL := c.cfg.URL
	if c.cfg.WorkerURL != "" {
		dbURL = c.cfg.WorkerURL
	}
	if o.user != "" {
		dbURL = withUser(dbURL, o.user)
	}
	if o.viaProxy {
		pr, err := newProxy(c.cfg.URL)
		if err != nil {
			c.t.Fatalf("cluster: proxy for %s: %v", id, err)
		}
		p.proxy = pr
		dbURL = pr.url
	}
	port, err := pgtest.FreePort()
	if err != nil {
		c.t.Fatalf("cluster: free port: %v", err)
	}
	p.metricsAddr = "127.0.0.1:" + strconv.Itoa(port)
	args := []string{
		"-database-url", withAppName(dbURL, id),
		"-schema", c.cfg.Schema,
		"-subscription", c.cfg.Subscription,
		"-category", c.cfg.Category,
		"-buckets", strconv.Itoa(c.cfg.Buckets),
		"-worker", id,
		"-lease", c.cfg.Kind.String(),
		"-ttl", c.cfg.Lease.TTL.String(),
		"-heartbeat", c.cfg.Lease.Heartbeat.String(),
		"-margin", c.cfg.Lease.Margin.String(),
		"-metrics-addr", p.metricsAddr,
	}
	if c.cfg.HandlerDelay > 0 {
		args = append(args, "-handler-delay", c.cfg.HandlerDelay.String())
	}
	if c.cfg.QueueCapacity > 0 {
		args = append(args, "-queue-capacity", strconv.Itoa(c.cfg.QueueCapacity))
	}
	if c.cfg.Exactly {
		args = append(args, "-exactly-once")
	}
	if c.cfg.PoolConns > 0 {
		args = append(args, "-pool-conns", strconv.Itoa(c.cfg.PoolConns))
	}
	args = append(args, c.cfg.Extra...)
	if c.cfg.NoListen {
		args = append(args, "-no-listen")
	}
	p.logPath = filepath.Join(c.logDir, id+".log")
	logf, err := os.Create(p.logPath)
	if err != nil {
		c.t.Fatalf("cluster: log file: %v", err)
	}
	cmd := exec.Command(workerBin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), "DATABASE_URL=") // the flag, never an inherited URL
	// The worker dies with the test binary, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		c.t.Fatalf("cluster: start %s: %v", id, err)
	}
	p.cmd, p.started = cmd, time.Now()
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(p.exited)
	}()
	c.mu.Lock()
	c.slots[slot] = p
	c.all = append(c.all, p)
	c.mu.Unlock()
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// kill is kill -9.
func (c *cluster) kill(p *proc) {
	c.t.Helper()
	p.mu.Lock()
	p.expected = true
	p.mu.Unlock()
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
	if p.proxy != nil {
		p.proxy.close()
	}
}

// stop is a graceful stop (SIGTERM): the worker drains, flushes its
// checkpoints and releases its leases. It fails the test if the worker
// does not exit cleanly within the timeout.
func (c *cluster) stop(p *proc, timeout time.Duration) {
	c.t.Helper()
	p.mu.Lock()
	p.expected = true
	paused := p.paused
	p.mu.Unlock()
	if paused {
		c.resume(p)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
		c.t.Errorf("cluster: %s did not stop within %v of SIGTERM (killed)\n%s", p.id, timeout, tail(p.logPath, 30))
	}
	if err := p.exitError(); err != nil {
		c.t.Errorf("cluster: %s stopped with %v\n%s", p.id, err, tail(p.logPath, 30))
	}
	if p.proxy != nil {
		p.proxy.close()
	}
}

// expectExit waits for p to exit by itself within timeout, and marks the
// exit expected; it returns the exit error (nil for status 0), or fails
// the test if p does not exit.
func (c *cluster) expectExit(p *proc, timeout time.Duration) error {
	c.t.Helper()
	select {
	case <-p.exited:
	case <-time.After(timeout):
		c.t.Fatalf("cluster: %s did not exit by itself within %v\n%s", p.id, timeout, tail(p.logPath, 30))
	}
	p.mu.Lock()
	p.expected = true
	p.mu.Unlock()
	if p.proxy != nil {
		p.proxy.close()
	}
	return p.exitError()
}

// pause is SIGSTOP: the process freezes, its connections stay open.
func (c *cluster) pause(p *proc) {
	p.mu.Lock()
	p.paused = true
	p.mu.Unlock()
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGSTOP)
}

// markCut records that p is cut off from the database (or no longer), so
// that live() leaves it out.
func (c *cluster) markCut(p *proc, cut bool) {
	p.mu.Lock()
	p.cut = cut
	p.mu.Unlock()
}

// resume is SIGCONT.
func (c *cluster) resume(p *proc) {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
	_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT)
}

func (p *proc) exitError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitErr
}

// live returns the ids of the running, unpaused incarnations.
func (c *cluster) live() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for _, p := range c.slots {
		p.mu.Lock()
		away := p.paused || p.cut
		p.mu.Unlock()
		if p.running() && !away {
			ids = append(ids, p.id)
		}
	}
	sort.Strings(ids)
	return ids
}

// current returns the current incarnation of slot.
func (c *cluster) current(slot string) *proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.slots[slot]
}

// stopAll stops every running worker gracefully, in parallel.
func (c *cluster) stopAll() {
	c.mu.Lock()
	var ps []*proc
	for _, p := range c.slots {
		if p.running() {
			ps = append(ps, p)
		}
	}
	c.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range ps {
		wg.Add(1)
		go func() { defer wg.Done(); c.stop(p, 60*time.Second) }()
	}
	wg.Wait()
}

// checkProcesses fails the test for a worker that exited on its own, and
// for a data race, panic or fatal error in any worker's log.
func (c *cluster) checkProcesses() {
	c.t.Helper()
	c.mu.Lock()
	all := append([]*proc(nil), c.all...)
	c.mu.Unlock()
	for _, p := range all {
		p.mu.Lock()
		expected := p.expected
		p.mu.Unlock()
		if !p.running() && !expected {
			c.t.Errorf("cluster: %s exited by itself: %v\n%s", p.id, p.exitError(), tail(p.logPath, 40))
		}
		for _, bad := range []string{"WARNING: DATA RACE", "panic:", "fatal error:"} {
			if line := grepFile(p.logPath, bad); line != "" {
				c.t.Errorf("cluster: %s logged %q:\n%s", p.id, bad, excerpt(p.logPath, bad, 60))
			}
		}
	}
}

// shutdown kills whatever still runs (a failed test's leftovers).
func (c *cluster) shutdown() {
	c.mu.Lock()
	all := append([]*proc(nil), c.all...)
	c.mu.Unlock()
	for _, p := range all {
		if p.running() {
			_ = syscall.Kill(p.cmd.Process.Pid, syscall.SIGCONT)
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			<-p.exited
		}
		if p.proxy != nil {
			p.proxy.close()
		}
	}
}

// withAppName sets application_name on a connection string (URL or
// keyword/value form), so the database can tell whose session did what.
func withAppName(conn, app string) string {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		u, err := url.Parse(conn)
		if err == nil {
			q := u.Query()
			q.Set("application_name", app)
			u.RawQuery = q.Encode()
			return u.String()
		}
	}
	return conn + " application_name=" + app
}

// withUser sets the user of a URL-form connection string.
func withUser(conn, user string) string {
	u, err := url.Parse(conn)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return conn + " user=" + user
	}
	u.User = url.User(user)
	return u.String()
}

// grepFile returns the first line of path containing s.
func grepFile(path, s string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			return sc.Text()
		}
	}
	return ""
}

// excerpt returns up to n lines of path from the first containing s.
func excerpt(path, s string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.Contains(l, s) {
			return strings.Join(lines[i:min(len(lines), i+n)], "\n")
		}
	}
	return ""
}

// tail returns the last n lines of path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
