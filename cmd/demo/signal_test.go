package main

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// liveDemo is a demo process whose output is read as it comes.
type liveDemo struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  strings.Builder
	done chan struct{}
	err  error
}

// startDemo starts the demo binary with env added to an environment
// without DATABASE_URL.
func startDemo(t *testing.T, env []string, args ...string) *liveDemo {
	t.Helper()
	cmd := exec.Command(demoBin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "OTEL_") && !strings.HasPrefix(kv, "TMPDIR=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, env...)
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdout, cmd.Stderr = pw, pw
	require.NoError(t, cmd.Start())
	_ = pw.Close()
	d := &liveDemo{cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			d.mu.Lock()
			d.out.WriteString(sc.Text() + "\n")
			d.mu.Unlock()
		}
		_ = pr.Close()
		d.err = cmd.Wait()
		close(d.done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-d.done
	})
	return d
}

func (d *liveDemo) output() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.out.String()
}

// waitFor waits until the output matches re.
func (d *liveDemo) waitFor(t *testing.T, re string) {
	t.Helper()
	m := regexp.MustCompile(re)
	if !pgtest.WaitFor(2*time.Minute, func() bool { return m.MatchString(d.output()) }) {
		t.Fatalf("no demo output matching %q within 2m:\n%s", re, d.output())
	}
}

// wait waits for the demo to exit and returns its exit status.
func (d *liveDemo) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-d.done:
	case <-time.After(3 * time.Minute):
		t.Fatalf("the demo did not exit:\n%s", d.output())
	}
	var ee *exec.ExitError
	if errors.As(d.err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, d.err)
	return 0
}

// workerPids returns the pids of the workers the demo said it started.
func (d *liveDemo) workerPids(t *testing.T) []int {
	t.Helper()
	var pids []int
	for _, m := range regexp.MustCompile(`w\d+ started \(pid (\d+)\)`).FindAllStringSubmatch(d.output(), -1) {
		pid, err := strconv.Atoi(m[1])
		require.NoError(t, err)
		pids = append(pids, pid)
	}
	require.NotEmpty(t, pids, d.output())
	return pids
}

// gone reports whether no process has pid (a zombie counts as gone).
func gone(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return true
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	// The state follows the command name in parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

// A SIGHUP (the terminal went away) finishes the demo as Ctrl-C does:
// the workers stop, the check runs and prints its outcome, and the
// embedded PostgreSQL's temporary directory is removed (issue 15).
func TestSIGHUPFinishesAndCleansUp(t *testing.T) {
	t.Parallel()
	_, err := pgtest.FindBinaries()
	require.NoError(t, err, "this test starts the embedded server: it needs the local server binaries")
	// The server runs as "postgres" when the test runs as root: it must
	// reach its directory.
	tmp := t.TempDir()
	require.NoError(t, os.Chmod(tmp, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(tmp), 0o755))
	d := startDemo(t, []string{"TMPDIR=" + tmp}, "-short", "-no-tui", "-duration", "10m", "-scenario=false")
	d.waitFor(t, `w2 started \(pid \d+\)`)
	d.waitFor(t, `s  status  appended`)
	matches, err := filepath.Glob(filepath.Join(tmp, "kumi-pg-*"))
	require.NoError(t, err)
	require.Len(t, matches, 1, "the embedded server's directory")
	pids := d.workerPids(t)
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGHUP))
	code := d.wait(t)
	out := d.output()
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "SIGHUP")
	require.Regexp(t, checkLine, out, "the outcome line")
	require.Contains(t, out, "— nothing lost")
	for _, pid := range pids {
		require.True(t, gone(pid), "worker pid %d still runs:\n%s", pid, out)
	}
	_, err = os.Stat(matches[0])
	require.True(t, os.IsNotExist(err), "%s left behind:\n%s", matches[0], out)
}

// When the demo dies without a chance to stop them (SIGKILL), its
// workers get SIGTERM from the kernel (Pdeathsig) and stop.
func TestWorkersFollowTheDemosDeath(t *testing.T) {
	t.Parallel()
	d := startDemo(t, []string{"DATABASE_URL=" + pgtest.URL(t)}, "-short", "-no-tui", "-duration", "10m", "-scenario=false")
	d.waitFor(t, `w2 started \(pid \d+\)`)
	d.waitFor(t, `s  status  appended`)
	pids := d.workerPids(t)
	require.NoError(t, d.cmd.Process.Kill())
	d.wait(t)
	for _, pid := range pids {
		pgtest.Eventually(t, time.Minute, func() bool { return gone(pid) }, "worker pid %d stops", pid)
	}
}

// timeout(1) sends its SIGTERM to the demo and to the demo's process
// group: the two copies arriving at once finish the run, they do not
// abort it.
func TestSIGTERMTwiceAtOnceStillFinishes(t *testing.T) {
	t.Parallel()
	d := startDemo(t, []string{"DATABASE_URL=" + pgtest.URL(t)}, "-short", "-no-tui", "-duration", "10m", "-scenario=false")
	d.waitFor(t, `s  status  appended`)
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	code := d.wait(t)
	out := d.output()
	require.Equal(t, exitOK, code, out)
	require.Contains(t, out, "SIGTERM: finishing")
	require.Regexp(t, checkLine, out, "the outcome line")
}
