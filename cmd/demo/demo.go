package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/term"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/redact"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability/otelsetup"
)

// The demo's subscription and category.
const (
	subscription = "demo"
	category     = "account"
)

// exitInterrupted is the exit status of a run aborted by a second Ctrl-C.
const exitInterrupted = 130

// step is one scripted moment of the scenario.
type step struct {
	at   time.Duration
	name string
	do   func(d *demo)
}

// scenario is the script: a join, a resize, a graceful leave, a kill -9
// of the busiest worker, and a replacement, spread over the run.
func scenario(duration time.Duration) []step {
	at := func(f float64) time.Duration { return time.Duration(f * float64(duration)) }
	return []step{
		{at(0.22), "join", func(d *demo) { d.join("scenario") }},
		{at(0.32), "resize", func(d *demo) { d.resize("scenario") }},
		{at(0.42), "leave", func(d *demo) { d.leave("scenario") }},
		{at(0.62), "kill", func(d *demo) { d.kill("scenario") }},
		{at(0.80), "join", func(d *demo) { d.join("scenario") }},
	}
}

// demo is one run. Only its main loop touches its fields.
type demo struct {
	cfg    config
	db     *database
	out    io.Writer
	tui    bool
	screen *screen
	keys   <-chan byte
	sigs   chan os.Signal
	fleet  *fleet
	prod   *producer

	start    time.Time
	phase    string
	steps    []step
	log      []logEntry
	cur      *sample
	rate     float64            // distinct events handled per second, smoothed
	rated    bool               // rate has been measured (two readings)
	wrate    map[string]float64 // per worker
	tracing  string
	console  string    // the console's page of the subscription; "" with -console off
	lastLine time.Time // plain mode: last status line
	signaled time.Time // when the signal that finishes the run came
	final    *tally
	warned   map[string]bool
	restore  func() // gives the terminal back its mode
}

type logEntry struct {
	at   time.Duration
	kind string
	text string
}

func runDemo(cfg config, stdout, stderr io.Writer) int {
	tty := isTerminal(stdout)
	tui := !cfg.noTUI && tty
	// SIGHUP — the terminal went away, or the session ended — finishes the
	// demo as Ctrl-C and SIGTERM do, so the workers stop, the check runs
	// and the embedded server's directory is removed. SIGPIPE is caught
	// (and dropped) so that a closed stdout turns into failed writes rather
	// than a death before the clean-up.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	pipes := make(chan os.Signal, 1)
	signal.Notify(pipes, syscall.SIGPIPE)
	defer signal.Stop(pipes)

	// A Ctrl-C while the database starts still cleans up.
	setup, cancel := context.WithCancel(context.Background())
	var interrupted atomic.Bool
	watching := make(chan struct{})
	go func() {
		select {
		case <-sigs:
			interrupted.Store(true)
			cancel()
		case <-watching:
		}
	}()
	fmt.Fprintln(stderr, "demo: preparing the database…")
	db, err := openDatabase(setup, cfg)
	close(watching)
	cancel()
	if interrupted.Load() {
		if db != nil {
			db.close()
		}
		fmt.Fprintln(stderr, "demo: interrupted")
		return exitInterrupted
	}
	if err != nil {
		fmt.Fprintf(stderr, "demo: %s\n", redact.URL(err.Error()))
		return exitFail
	}
	defer db.close()

	d := &demo{cfg: cfg, db: db, out: stdout, tui: tui, sigs: sigs, phase: "running",
		wrate: map[string]float64{}, warned: map[string]bool{}}
	if cfg.traces != "" {
		// The workers inherit it (newFleet takes the environment).
		path, err := filepath.Abs(cfg.traces)
		if err == nil {
			err = os.Setenv("KUMI_TRACES_FILE", path)
		}
		if err != nil {
			fmt.Fprintf(stderr, "demo: -traces: %v\n", err)
			return exitUsage
		}
	}
	d.tracing = tracingNote()
	if cfg.console != consoleOff {
		page, stop, err := serveConsole(cfg.console, db)
		if err != nil {
			fmt.Fprintf(stderr, "demo: %v\n", err)
			return exitFail
		}
		defer stop()
		d.console = page // the header (plain mode) or the live view shows it
	}
	if otelConfigured() {
		shutdown, err := otelsetup.Setup(context.Background(), otelsetup.Options{
			ServiceName: "kumi-demo", Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			fmt.Fprintf(stderr, "demo: tracing: %v\n", err)
			return exitFail
		}
		defer func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = shutdown(ctx)
			cancel()
		}()
	}
	var logTo io.Writer
	if cfg.verbose && !tui {
		logTo = stdout
	}
	if d.fleet, err = newFleet(cfg, db, subscription, category, logTo); err != nil {
		fmt.Fprintf(stderr, "demo: %v\n", err)
		return exitFail
	}
	if tui {
		d.screen = newScreen(stdout)
		if term.IsTerminal(int(os.Stdin.Fd())) {
			restore, keys, err := rawKeys()
			if err == nil {
				d.restore = restore
				d.keys = keys
			}
		}
		defer d.closeScreen()
	} else if term.IsTerminal(int(os.Stdin.Fd())) {
		d.keys = lineKeys()
	}
	return d.run()
}

func (d *demo) run() int {
	seq := eventsource.NewSequencer(d.db.store, eventsource.SequencerOptions{})
	_ = seq.Start(context.Background()) // fails only on an ended context, or once stopped
	defer func() { _ = seq.Stop(context.Background()) }()
	d.start = time.Now()
	d.prod = newProducer(d.db.store, category, d.cfg.rate, d.cfg.streams)
	d.header()
	for range d.cfg.workers {
		d.join("start")
	}
	d.prod.start()
	defer d.prod.stop()
	if d.cfg.script && d.cfg.duration > 0 {
		d.steps = scenario(d.cfg.duration)
	}
	var end <-chan time.Time
	if d.cfg.duration > 0 {
		t := time.NewTimer(d.cfg.duration)
		defer t.Stop()
		end = t.C
	}
	tick := time.NewTicker(d.refresh())
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-tick.C:
			d.poll()
			for len(d.steps) > 0 && time.Since(d.start) >= d.steps[0].at {
				s := d.steps[0]
				d.steps = d.steps[1:]
				s.do(d)
			}
			d.render()
		case ex := <-d.fleet.exits:
			d.exited(ex)
		case k, ok := <-d.keys:
			if !ok {
				d.keys = nil
				continue
			}
			done = d.key(k)
		case sig := <-d.sigs:
			d.signaled = time.Now()
			if sig == syscall.SIGHUP {
				d.logf("signal", "SIGHUP (the terminal went away): finishing")
			} else {
				d.logf("signal", "%s: finishing (Ctrl-C again to abort)", signalName(sig))
			}
			done = true
		case <-end:
			d.logf("end", "%v are up", d.cfg.duration)
			done = true
		}
	}
	return d.finish()
}

// refresh is how often the view is redrawn and the database read.
func (d *demo) refresh() time.Duration {
	if d.tui {
		return 300 * time.Millisecond
	}
	return 250 * time.Millisecond
}

// key handles a key; it reports whether to finish.
func (d *demo) key(k byte) bool {
	switch k {
	case 'a', 'A':
		d.join("key")
	case 'l', 'L':
		d.leave("key")
	case 'k', 'K':
		d.kill("key")
	case 'r', 'R':
		d.resize("key")
	case 'q', 'Q', 3: // 3: Ctrl-C in raw mode
		d.logf("key", "finishing")
		return true
	}
	d.render()
	return false
}

func (d *demo) join(why string) {
	p, err := d.fleet.add()
	if err != nil {
		d.logf("error", "%v", err)
		return
	}
	kind := "join"
	if why == "start" {
		kind = "start"
	}
	d.logf(kind, "%s started (pid %d), serving %s/metrics, /healthz, /status%s", p.name, p.Pid(), p.serves, because(why))
}

// leave stops the longest-running worker gracefully.
func (d *demo) leave(why string) {
	run := d.fleet.running()
	if len(run) < 2 {
		d.logf("skip", "graceful leave skipped: it would leave no worker running")
		return
	}
	p := run[0]
	d.fleet.leave(p)
	d.logf("leave", "%s sent SIGTERM: finish in-flight events, flush checkpoints, release leases%s", p.name, because(why))
}

// kill ends the worker owning the most buckets with SIGKILL.
func (d *demo) kill(why string) {
	run := d.fleet.running()
	if len(run) == 0 {
		d.logf("skip", "kill skipped: no worker running")
		return
	}
	owned := map[string]int{}
	if d.cur != nil {
		owned = d.cur.in.OwnedBy()
	}
	sort.SliceStable(run, func(i, j int) bool { return owned[run[i].name] > owned[run[j].name] })
	p := run[0]
	d.fleet.kill(p)
	wait := fmt.Sprintf("its leases lapse after the ttl (%v)", d.cfg.ttl)
	if d.cfg.lease == "session" {
		wait = "its session is gone, so its buckets move on the next pass"
	}
	d.logf("kill", "%s killed with SIGKILL holding %d buckets: %s%s", p.name, owned[p.name], wait, because(why))
}

// resize changes the subscription's bucket count online, alternating
// between the -buckets it started with and twice that (docs/design/resize.md):
// it builds the index for the new count and requests the resize, as `kumi
// resize --no-wait` does; the workers do the rest, and poll logs its
// progress. A resize already running is left alone.
func (d *demo) resize(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := leasestore.ReadResize(ctx, d.db.pool, d.db.schema, subscription)
	if err != nil {
		d.logf("error", "resize: %s", redact.URL(err.Error()))
		return
	}
	if cur.Resizing() {
		d.logf("skip", "resize skipped: %d → %d is still running (state %s)", cur.Buckets, cur.NextBuckets, cur.State)
		return
	}
	to := 2 * d.cfg.buckets
	if cur.Buckets != d.cfg.buckets {
		to = d.cfg.buckets
	}
	r, err := actors.Resize(ctx, d.db.store, subscription, to, actors.ResizeOptions{By: "demo"})
	if err != nil {
		d.logf("error", "resize to %d: %s", to, redact.URL(err.Error()))
		return
	}
	d.logf("resize", "%d → %d buckets requested (generation %d → %d): the old buckets drain to a cut, "+
		"each new one starts once its old ones have drained%s", r.Buckets, to, r.Generation, r.Generation+1, because(why))
}

// signalName is "SIGINT" for syscall.SIGINT, and so on.
func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}

func because(why string) string {
	switch why {
	case "scenario":
		return "  [scenario]"
	case "key":
		return "  [key]"
	}
	return ""
}

func (d *demo) exited(ex exit) {
	switch {
	case ex.state == stateLeft && ex.err == nil:
		d.logf("left", "%s stopped gracefully", ex.p.name)
	case ex.state == stateLeft:
		d.logf("left", "%s stopped, with %v: %s", ex.p.name, ex.err, redact.URL(ex.lastLine))
	case ex.state == stateKilled:
		d.logf("gone", "%s is dead", ex.p.name)
	default:
		detail := ""
		if ex.err != nil {
			detail = ": " + ex.err.Error()
		}
		if ex.lastLine != "" {
			detail += ": " + ex.lastLine
		}
		d.logf("exited", "%s exited on its own%s", ex.p.name, redact.URL(detail))
	}
}

// logf records an event; plain mode prints it at once. Its text may name
// workers and quote their output: it is escaped for the terminal.
func (d *demo) logf(kind, format string, args ...any) {
	e := logEntry{at: time.Since(d.start), kind: kind, text: termsafe.String(fmt.Sprintf(format, args...))}
	if d.start.IsZero() {
		e.at = 0
	}
	d.log = append(d.log, e)
	if len(d.log) > 200 {
		d.log = d.log[len(d.log)-200:]
	}
	if !d.tui {
		fmt.Fprintf(d.out, "%7.1fs  %-7s %s\n", e.at.Seconds(), e.kind, e.text)
	}
}

// finish stops the producer, waits until every appended event has been
// handled, stops the workers gracefully and checks the sink.
func (d *demo) finish() int {
	d.prod.stop()
	d.phase = "draining"
	d.logf("drain", "producer stopped after %d appends; waiting for the workers to handle every event", d.prod.appended.Load())
	ctx := context.Background()
	limit := max(20*time.Second, 8*d.cfg.ttl)
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(d.refresh())
	defer tick.Stop()
	for {
		if len(d.fleet.running()) == 0 {
			d.logf("drain", "no worker running: starting one to drain")
			d.join("drain")
		}
		t, err := count(ctx, d.db, subscription, category)
		if err == nil {
			d.final = &t
			if t.Missing == 0 {
				break
			}
		}
		if time.Now().After(deadline) {
			d.logf("drain", "gave up waiting after %v", limit)
			break
		}
		select {
		case <-tick.C:
			d.poll()
			d.render()
		case ex := <-d.fleet.exits:
			d.exited(ex)
		case sig := <-d.sigs:
			if d.aborts(sig) {
				return d.abort()
			}
		case k, ok := <-d.keys:
			if !ok {
				d.keys = nil
			} else if k == 3 {
				return d.abort()
			}
		}
	}
	d.phase = "stopping"
	d.logf("stop", "stopping the workers gracefully")
	stopped := make(chan struct{})
	go func() { d.fleet.stopAll(40 * time.Second); close(stopped) }()
	for waiting := true; waiting; {
		select {
		case <-stopped:
			waiting = false
		case ex := <-d.fleet.exits:
			d.exited(ex)
		case <-tick.C:
			d.poll()
			d.render()
		case sig := <-d.sigs:
			if d.aborts(sig) {
				return d.abort()
			}
		case k, ok := <-d.keys:
			if !ok {
				d.keys = nil
			} else if k == 3 {
				return d.abort()
			}
		}
	}
	for drained := false; !drained; {
		select {
		case ex := <-d.fleet.exits:
			d.exited(ex)
		default:
			drained = true
		}
	}
	t, err := count(ctx, d.db, subscription, category)
	if err != nil {
		d.phase = "done"
		d.render()
		d.closeScreen()
		fmt.Fprintf(d.out, "check: could not count: %s\n", redact.URL(err.Error()))
		return exitFail
	}
	d.final = &t
	d.phase = "done"
	d.poll()
	d.render()
	d.closeScreen()
	line, ok := t.verdict(d.cfg.exactly)
	if err := d.prod.err(); err != nil {
		fmt.Fprintf(d.out, "producer: %d appends failed, the last with: %s\n", d.prod.failed.Load(), redact.URL(err.Error()))
	}
	fmt.Fprintln(d.out, line)
	if ok {
		return exitOK
	}
	return exitFail
}

// aborts reports whether a signal during the drain or the stop aborts the
// run: a second Ctrl-C or SIGTERM does, but not a hang-up (one may follow
// another as the session ends), nor a copy of the signal that started the
// finish (timeout(1) sends SIGTERM both to the demo and to its process
// group, so it arrives twice at once).
func (d *demo) aborts(sig os.Signal) bool {
	return sig != syscall.SIGHUP && (d.signaled.IsZero() || time.Since(d.signaled) > time.Second)
}

// abort kills every worker at once (a second Ctrl-C).
func (d *demo) abort() int {
	d.fleet.killAll()
	d.fleet.waitAll()
	d.closeScreen()
	fmt.Fprintln(d.out, "demo: aborted; workers killed, no check made")
	return exitInterrupted
}

// closeScreen ends the live view and gives the terminal back its mode.
func (d *demo) closeScreen() {
	if d.screen != nil {
		d.screen.close()
	}
	if d.restore != nil {
		d.restore()
		d.restore = nil
	}
}

// header prints what runs where (plain mode; the live view shows it).
func (d *demo) header() {
	if d.tui {
		return
	}
	fmt.Fprintf(d.out, "kumi demo: %d workers, %d buckets, %d events/s for %s, %s leases (ttl %v)\n",
		d.cfg.workers, d.cfg.buckets, d.cfg.rate, durationText(d.cfg.duration), d.cfg.lease, d.cfg.ttl)
	fmt.Fprintf(d.out, "database: %s\n", d.db.describe)
	if d.console != "" {
		fmt.Fprintf(d.out, "console:  %s\n", d.console)
	}
	fmt.Fprintf(d.out, "inspect:  %s\n", d.db.kumiCommand(subscription, category))
	fmt.Fprintf(d.out, "traces:   %s\n", d.tracing)
}

func durationText(d time.Duration) string {
	if d == 0 {
		return "until q or Ctrl-C"
	}
	return d.String()
}

// otelConfigured reports whether the environment asks for trace export.
func otelConfigured() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		os.Getenv("KUMI_TRACES_FILE") != ""
}

// tracingNote says where the traces go, or how to turn them on.
func tracingNote() string {
	if f := os.Getenv("KUMI_TRACES_FILE"); f != "" && os.Getenv("OTEL_TRACES_EXPORTER") == "" {
		return fmt.Sprintf("appended to %s, a span a line (ownership changes: "+
			"jq -c 'select(.Name | startswith(\"kumi.lease.\")) | {Name, StartTime}' %s)", f, f)
	}
	ep := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if ep == "" {
		ep = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	if ep == "" {
		return "off — `make demo DEMO_FLAGS=\"-traces /tmp/kumi-traces.jsonl\"` writes them to a file; or `make jaeger` " +
			"(a first build of about ten minutes), then OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 make demo"
	}
	if u, err := url.Parse(ep); err == nil {
		ep = u.Redacted()
	}
	query := os.Getenv("KUMI_JAEGER_URL")
	if query == "" {
		query = "http://127.0.0.1:16686"
	}
	return fmt.Sprintf("exported to %s; Jaeger: %s (services kumi-demo-worker, kumi-demo; "+
		"`make jaeger` has no UI: %s/api/traces?service=kumi-demo-worker&limit=20)", ep, query, query)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// rawKeys puts stdin in raw mode and returns its key presses.
func rawKeys() (restore func(), keys <-chan byte, err error) {
	fd := int(os.Stdin.Fd())
	old, err := term.MakeRaw(fd)
	if err != nil {
		return nil, nil, err
	}
	ch := make(chan byte, 16)
	go func() {
		defer close(ch)
		buf := make([]byte, 16)
		for {
			n, err := os.Stdin.Read(buf)
			for _, b := range buf[:n] {
				ch <- b
			}
			if err != nil {
				return
			}
		}
	}()
	return func() { _ = term.Restore(fd, old) }, ch, nil
}

// lineKeys reads keys a line at a time (plain mode on a terminal): type
// a letter and Enter.
func lineKeys() <-chan byte {
	ch := make(chan byte, 16)
	go func() {
		defer close(ch)
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			if s := strings.TrimSpace(sc.Text()); s != "" {
				ch <- s[0]
			}
		}
	}()
	return ch
}
