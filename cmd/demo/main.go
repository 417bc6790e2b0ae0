package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kumi-run/kumi/internal/redact"
	"github.com/kumi-run/kumi/internal/worker"
)

// Exit codes.
const (
	exitOK    = 0
	exitFail  = 1 // something was lost, or the demo could not run
	exitUsage = 2
)

// config is the demo's command line.
type config struct {
	workers  int
	buckets  int
	rate     int
	duration time.Duration
	lease    string
	ttl      time.Duration
	streams  int
	short    bool
	noTUI    bool
	script   bool
	exactly  bool
	verbose  bool
	keep     bool
	schema   string
	pgPort   int
	console  string
	traces   string // -traces: the file every process appends its spans to
}

const usageText = `kumi demo: several worker processes share one subscription while a producer
appends; watch buckets move on a join, a resize, a graceful leave and a kill -9, then
check that every appended event was handled.

Usage: go run ./cmd/demo [flags]        (make demo DEMO_FLAGS="...")

Without DATABASE_URL it starts a throwaway PostgreSQL from the local server
binaries and removes it on exit; with DATABASE_URL it works in a fresh schema
of that database and drops it on exit (-keep keeps it).

Keys (on a terminal): a add a worker, l stop one gracefully, k kill -9 the
busiest, r resize (N → 2N → N, online), q finish (drain, stop, check). Ctrl-C, SIGTERM and SIGHUP (the
terminal closing) finish too; a second Ctrl-C aborts.

Flags:
`

// parseFlags reads the command line; -short changes the defaults of the
// flags not given.
func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	var c config
	fs.IntVar(&c.workers, "workers", 3, "worker processes at the start")
	fs.IntVar(&c.buckets, "buckets", 16, "buckets of the subscription (N)")
	fs.IntVar(&c.rate, "rate", 200, "events appended per second")
	fs.DurationVar(&c.duration, "duration", 60*time.Second, "how long the producer runs before the final check (0: until q or Ctrl-C)")
	fs.StringVar(&c.lease, "lease", "row", "lease kind: row (expiry-based) or session (advisory lock: a killed worker's buckets move at once)")
	fs.DurationVar(&c.ttl, "ttl", 3*time.Second, "lease ttl; heartbeat is ttl/6, margin ttl/3")
	fs.IntVar(&c.streams, "streams", 64, "distinct streams the producer appends to")
	fs.BoolVar(&c.short, "short", false, "a run of a few seconds (2 workers, 8 buckets, 100/s, 6s, ttl 1.5s), scenario included: for tests")
	fs.BoolVar(&c.noTUI, "no-tui", false, "plain log lines instead of the live view (the default when stdout is not a terminal)")
	fs.BoolVar(&c.script, "scenario", true, "run the scripted join, resize, graceful leave and kill -9 (false: only the keys)")
	fs.BoolVar(&c.exactly, "exactly-once", false, "workers commit each sink row with the checkpoint (actors.CommitWithCheckpoint): no duplicates even after a kill")
	fs.BoolVar(&c.verbose, "v", false, "pass the workers' logs through (with -no-tui)")
	fs.BoolVar(&c.keep, "keep", false, "with DATABASE_URL: keep the demo's schema instead of dropping it")
	fs.StringVar(&c.schema, "schema", "", "with DATABASE_URL: use this schema (kept) instead of a fresh kumi_demo_* one")
	fs.IntVar(&c.pgPort, "pg-port", 0, "port of the embedded PostgreSQL (0: a free one)")
	fs.StringVar(&c.traces, "traces", "", "append every span (ownership changes, deliveries) to this file, a line of JSON each, for a look without Jaeger (jq reads it)")
	fs.StringVar(&c.console, "console", "127.0.0.1:0", "address of the web console that shows the run (port 0: a free one; "+consoleOff+": none)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q (flags only; see -h)", fs.Arg(0))
	}
	if c.short {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		def := func(name string, apply func()) {
			if !set[name] {
				apply()
			}
		}
		def("workers", func() { c.workers = 2 })
		def("buckets", func() { c.buckets = 8 })
		def("rate", func() { c.rate = 100 })
		def("duration", func() { c.duration = 6 * time.Second })
		def("ttl", func() { c.ttl = 1500 * time.Millisecond })
		def("streams", func() { c.streams = 32 })
	}
	switch {
	case c.workers < 1 || c.workers > 32:
		return c, fmt.Errorf("-workers %d: use 1 to 32", c.workers)
	case c.buckets < 1 || c.buckets > 1024:
		return c, fmt.Errorf("-buckets %d: use 1 to 1024", c.buckets)
	case c.rate < 1 || c.rate > 20000:
		return c, fmt.Errorf("-rate %d: use 1 to 20000 events per second", c.rate)
	case c.duration < 0:
		return c, fmt.Errorf("-duration %v: must not be negative", c.duration)
	case c.lease != "row" && c.lease != "session":
		return c, fmt.Errorf("-lease %q: use row or session", c.lease)
	case c.ttl < 300*time.Millisecond:
		return c, fmt.Errorf("-ttl %v: use at least 300ms", c.ttl)
	case c.streams < 1:
		return c, fmt.Errorf("-streams %d: use at least 1", c.streams)
	case c.pgPort < 0 || c.pgPort > 65535:
		return c, fmt.Errorf("-pg-port %d: not a TCP port", c.pgPort)
	}
	if err := checkConsoleAddr(c.console); err != nil {
		return c, err
	}
	return c, nil
}

// heartbeat and margin follow from the ttl: ttl/6 and ttl/3, so that
// 3·heartbeat + margin < ttl (docs/operations.md).
func (c config) heartbeat() time.Duration { return c.ttl / 6 }
func (c config) margin() time.Duration    { return c.ttl / 3 }

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "worker" {
		return runWorker(args[1:], stderr)
	}
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return exitUsage
	}
	return runDemo(cfg, stdout, stderr)
}

// runWorker is one worker process: the demo starts itself with "worker".
func runWorker(args []string, stderr io.Writer) int {
	cfg, err := worker.ParseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "worker: %v\n", err)
		return exitUsage
	}
	if err := worker.Run(context.Background(), cfg); err != nil {
		fmt.Fprintf(stderr, "worker %s: %s\n", cfg.Worker, redact.Conn(cfg.DatabaseURL, err.Error()))
		return exitFail
	}
	return exitOK
}
