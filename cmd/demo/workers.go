package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process states.
const (
	stateRunning = "running"
	stateLeaving = "leaving" // SIGTERM sent
	stateLeft    = "left"    // exited after SIGTERM
	stateKilled  = "killed"  // SIGKILL sent
	stateExited  = "exited"  // exited on its own
)

// proc is one worker process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	started time.Time
	// serves is where it serves /metrics, /healthz and /status
	// ("http://127.0.0.1:PORT").
	serves string

	mu       sync.Mutex
	state    string
	lastLine string // last line of its stderr
	exitErr  error
	done     chan struct{}
}

// State is the process's state: stateRunning, stateLeaving, …
func (p *proc) State() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Pid returns the process id.
func (p *proc) Pid() int { return p.cmd.Process.Pid }

// exit is a worker that ended, for the event log.
type exit struct {
	p        *proc
	state    string
	err      error
	lastLine string
}

// fleet starts and stops the worker processes: the demo's own binary with
// the "worker" subcommand.
type fleet struct {
	exe   string
	args  []string // worker flags, without -worker
	env   []string
	logTo io.Writer // worker stderr lines go here too (nil: kept only)
	exits chan exit

	mu    sync.Mutex
	procs []*proc
	next  int
}

func newFleet(cfg config, db *database, subscription, category string, logTo io.Writer) (*fleet, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the demo's own binary to start workers: %w", err)
	}
	args := []string{
		"-schema", db.schema, "-subscription", subscription, "-category", category,
		"-buckets", fmt.Sprint(cfg.buckets), "-lease", cfg.lease,
		"-ttl", cfg.ttl.String(), "-heartbeat", cfg.heartbeat().String(), "-margin", cfg.margin().String(),
	}
	if cfg.exactly {
		args = append(args, "-exactly-once")
	}
	if !cfg.verbose {
		args = append(args, "-quiet")
	}
	// The URL goes through the environment, never the command line, where
	// ps would show its password.
	env := []string{"DATABASE_URL=" + db.url}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") {
			env = append(env, kv)
		}
	}
	if os.Getenv("OTEL_SERVICE_NAME") == "" {
		env = append(env, "OTEL_SERVICE_NAME=kumi-demo-worker")
	}
	return &fleet{exe: exe, args: args, env: env, logTo: logTo, exits: make(chan exit, 256)}, nil
}

// add starts one more worker.
func (f *fleet) add() (*proc, error) {
	f.mu.Lock()
	f.next++
	name := fmt.Sprintf("w%d", f.next)
	f.mu.Unlock()
	addr, err := freePort()
	if err != nil {
		return nil, fmt.Errorf("a port for worker %s's /metrics: %w", name, err)
	}
	cmd := exec.Command(f.exe, append([]string{"worker", "-worker", name, "-metrics-addr", addr}, f.args...)...)
	cmd.Env = f.env
	// Its own process group, so a Ctrl-C at the terminal reaches only the
	// demo, which stops the workers in order; and SIGTERM should the demo
	// itself die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, started: time.Now(), state: stateRunning, done: make(chan struct{}), serves: "http://" + addr}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.lastLine = line
			p.mu.Unlock()
			if f.logTo != nil {
				fmt.Fprintf(f.logTo, "%s | %s\n", name, line)
			}
		}
		err := cmd.Wait()
		p.mu.Lock()
		switch p.state {
		case stateLeaving:
			p.state = stateLeft
		case stateRunning:
			p.state = stateExited
		}
		p.exitErr = err
		ex := exit{p: p, state: p.state, err: err, lastLine: p.lastLine}
		p.mu.Unlock()
		close(p.done)
		select {
		case f.exits <- ex:
		default: // nobody is reading any more: the demo is ending
		}
	}()
	return p, nil
}

// freePort returns a local address whose port was free a moment ago, for a
// worker to serve its /metrics, /healthz and /status on.
func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String(), nil
}

// leave asks a worker to stop gracefully (SIGTERM): it finishes its
// in-flight events, flushes its checkpoints and releases its leases.
func (f *fleet) leave(p *proc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != stateRunning {
		return
	}
	p.state = stateLeaving
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
}

// kill ends a worker at once (SIGKILL, as kill -9): no flush, no release.
func (f *fleet) kill(p *proc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.state != stateRunning && p.state != stateLeaving {
		return
	}
	p.state = stateKilled
	_ = p.cmd.Process.Kill()
}

// all returns every worker started, in order.
func (f *fleet) all() []*proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*proc(nil), f.procs...)
}

// running returns the workers in state running, in start order.
func (f *fleet) running() []*proc {
	var out []*proc
	for _, p := range f.all() {
		if p.State() == stateRunning {
			out = append(out, p)
		}
	}
	return out
}

// stopAll stops every worker gracefully and waits up to grace, then kills
// the rest.
func (f *fleet) stopAll(grace time.Duration) {
	procs := f.all()
	for _, p := range procs {
		f.leave(p)
	}
	deadline := time.After(grace)
	for _, p := range procs {
		select {
		case <-p.done:
		case <-deadline:
			f.killAll()
			f.waitAll()
			return
		}
	}
}

// killAll kills every worker still alive.
func (f *fleet) killAll() {
	for _, p := range f.all() {
		f.kill(p)
	}
}

func (f *fleet) waitAll() {
	for _, p := range f.all() {
		<-p.done
	}
}
