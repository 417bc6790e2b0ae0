// Package exampletest runs kumi's example programs as their READMEs say, as
// processes of their own, against the tests' throwaway PostgreSQL.
package exampletest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// Wait bounds every wait of these tests.
const Wait = time.Minute

// bin is the example's binary, built by Main.
var bin string

// Main builds the example pkg (an import path) and runs the package's
// tests against pgtest's database. Use it from TestMain.
func Main(m *testing.M, pkg string) {
	b, err := pgtest.BuildBinary(pkg, pkg[strings.LastIndex(pkg, "/")+1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "example tests: build:", err)
		os.Exit(2)
	}
	bin = b
	pgtest.Main(m)
}

// NewDatabase creates a database that no other test uses, dropped when the
// test ends, and returns its URL: the examples use the schema "kumi", as a
// user's program would, so each test gets a database of its own.
func NewDatabase(t *testing.T) string {
	t.Helper()
	base := pgtest.URL(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "ex_" + hex.EncodeToString(b[:])
	ctx := context.Background()
	admin := func(sql string) error {
		conn, err := pgx.Connect(ctx, base)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, sql)
		return err
	}
	if err := admin("CREATE DATABASE " + name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() { _ = admin("DROP DATABASE IF EXISTS " + name + " WITH (FORCE)") })
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", base, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Process is a running example.
type Process struct {
	cmd    *exec.Cmd
	lines  chan string
	stderr syncBuffer
	done   chan struct{}
	err    error
	out    []string
}

// Start runs the example with DATABASE_URL set to databaseURL.
func Start(t *testing.T, databaseURL string, args ...string) *Process {
	t.Helper()
	p := &Process{cmd: exec.Command(bin, args...), lines: make(chan string, 1024), done: make(chan struct{})}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "OTEL_") {
			p.cmd.Env = append(p.cmd.Env, kv)
		}
	}
	p.cmd.Env = append(p.cmd.Env, "DATABASE_URL="+databaseURL)
	p.cmd.Stderr = &p.stderr
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		_, _ = io.Copy(io.Discard, stdout)
		p.err = p.cmd.Wait()
		close(p.lines)
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// WaitLine waits for a line of the example's output that contains s.
func (p *Process) WaitLine(t *testing.T, s string) string {
	t.Helper()
	timeout := time.After(Wait)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("the example exited without printing %q; it printed:\n%s\nstderr:\n%s", s, strings.Join(p.out, "\n"), p.stderr.String())
			}
			p.out = append(p.out, l)
			if strings.Contains(l, s) {
				return l
			}
		case <-timeout:
			t.Fatalf("no line with %q within %v; printed:\n%s\nstderr:\n%s", s, Wait, strings.Join(p.out, "\n"), p.stderr.String())
		}
	}
}

// Terminate sends the example SIGTERM.
func (p *Process) Terminate(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
}

// Exit waits for the example to exit and fails the test unless it exited
// with status 0, without a data race.
func (p *Process) Exit(t *testing.T) {
	t.Helper()
	timeout := time.After(Wait)
	for {
		select {
		case l, ok := <-p.lines:
			if ok {
				p.out = append(p.out, l)
				continue
			}
			<-p.done
			if p.err != nil || strings.Contains(p.stderr.String(), "DATA RACE") {
				t.Fatalf("the example exited with %v; printed:\n%s\nstderr:\n%s", p.err, strings.Join(p.out, "\n"), p.stderr.String())
			}
			return
		case <-timeout:
			t.Fatalf("the example did not exit within %v; printed:\n%s\nstderr:\n%s", Wait, strings.Join(p.out, "\n"), p.stderr.String())
		}
	}
}

// syncBuffer is the example's stderr, read while the example writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Output returns the lines the example printed that the test has read.
func (p *Process) Output() []string { return p.out }
