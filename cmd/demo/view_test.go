package main

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
)

// hostile is a worker id a terminal would act on: ESC, BEL, CR, a C1
// CSI, DEL, a bidi override, a tab and a newline.
const hostile = "w\x1b[2J\a\r\u009b31m\x7f\u202eevil\tx\ny"

// testDemo is a demo with a sample of its own and no processes.
func testDemo(t *testing.T, rows []inspect.BucketRow, workers []leasestore.WorkerState) *demo {
	t.Helper()
	d := &demo{cfg: config{buckets: len(rows), duration: time.Minute, lease: "row", ttl: time.Second},
		db: &database{describe: "test"}, fleet: &fleet{}, prod: &producer{}, phase: "running",
		wrate: map[string]float64{}, warned: map[string]bool{}, start: time.Now(), tui: true}
	d.cur = &sample{at: time.Now(), in: inspect.Inspection{Buckets: len(rows), Rows: rows, Workers: workers},
		byWorker: map[string]int64{}}
	return d
}

func requireTermSafe(t *testing.T, lines []string) {
	t.Helper()
	for _, l := range lines {
		// The view's own colours are the only escape sequences.
		l = strings.NewReplacer("\x1b[1m", "", "\x1b[2m", "", "\x1b[0m", "").Replace(l)
		for _, r := range l {
			require.False(t, termsafe.Unsafe(r), "%q in %q", r, l)
		}
	}
}

// Worker ids come from the database: the live view, the status line and
// the event log show them escaped (issue 18 §5).
func TestViewEscapesWhatItReadsFromTheDatabase(t *testing.T) {
	t.Parallel()
	row := func(b int) inspect.BucketRow {
		r := inspect.BucketRow{Live: true, Lag: 0}
		r.Bucket, r.Owner, r.Epoch = b, hostile, 1
		return r
	}
	d := testDemo(t, []inspect.BucketRow{row(0), row(1)}, []leasestore.WorkerState{{Worker: hostile, Live: true}})
	d.ownership(nil, d.cur)
	lines := d.frame(200, 0)
	requireTermSafe(t, lines)
	require.Contains(t, strings.Join(lines, "\n"), `\u202eevil\tx\ny took 0 1`)
	d.tui = false
	requireTermSafe(t, []string{d.statusLine()})
	require.Contains(t, d.statusLine(), `w\x1b[2J`)
}

// plain drops the view's colours.
func plain(lines []string) []string {
	out := make([]string, len(lines))
	for i, l := range lines {
		out[i] = regexp.MustCompile(`\x1b\[[0-9;]*m`).ReplaceAllString(l, "")
	}
	return out
}

// busyDemo is a demo of n buckets over three running workers, with two
// stopped ones and a long event log.
func busyDemo(t *testing.T, n int) *demo {
	t.Helper()
	var rows []inspect.BucketRow
	for b := range n {
		r := inspect.BucketRow{Live: true, Lag: int64(b % 3)}
		r.Bucket, r.Owner, r.Epoch = b, fmt.Sprintf("w%d", b%3+1), 1
		rows = append(rows, r)
	}
	d := testDemo(t, rows, nil)
	for i, state := range []string{stateRunning, stateRunning, stateRunning, stateLeft, stateKilled} {
		d.fleet.procs = append(d.fleet.procs, &proc{name: fmt.Sprintf("w%d", i+1), state: state,
			cmd: &exec.Cmd{Process: &os.Process{Pid: 1000 + i}}})
	}
	for i := range 20 {
		d.logf("owner", "event %d", i)
	}
	d.keys = make(chan byte)
	return d
}

// The live view was 31–33 lines and scrolled away in a 24-line terminal:
// it fits the height, and says what it cut (issue 15).
func TestFrameFitsTheTerminalHeight(t *testing.T) {
	t.Parallel()
	for _, n := range []int{16, 1024} {
		for _, height := range []int{24, 16} {
			lines := plain(busyDemo(t, n).frame(80, height))
			require.LessOrEqual(t, len(lines), height-1, "%d buckets, %d lines:\n%s", n, height, strings.Join(lines, "\n"))
			last := lines[len(lines)-1]
			require.Contains(t, last, fmt.Sprintf("fit to %d lines; hidden: ", height), strings.Join(lines, "\n"))
			if n == 1024 {
				require.Regexp(t, `\d+ buckets$`, last)
			} else {
				require.Regexp(t, `(?m)\b15 w1\b`, strings.Join(lines, "\n"), "every bucket shown")
			}
		}
	}
	lines := plain(busyDemo(t, 16).frame(80, 24))
	text := strings.Join(lines, "\n")
	require.Contains(t, text, "BUCKET OWNER (compact)")
	require.Regexp(t, `(?m)^ 0 w1\s+1 w2\s+2 w3`, text)
	require.Contains(t, text, "event 19", "the newest event stays")
	require.Contains(t, lines[len(lines)-1], "2 stopped workers")
	// A tall terminal gets the full view and no note.
	lines = plain(busyDemo(t, 16).frame(200, 60))
	require.NotContains(t, strings.Join(lines, "\n"), "fit to")
	require.Contains(t, strings.Join(lines, "\n"), "CHECKPOINT")
}

// The console's address takes no line of its own: it heads the database
// line, so a 24-line terminal still fits the view (issue 15).
func TestTheConsoleURLFitsInAnExistingLine(t *testing.T) {
	t.Parallel()
	without := plain(busyDemo(t, 16).frame(80, 24))
	d := busyDemo(t, 16)
	d.console = "http://127.0.0.1:41234/s/demo"
	with := plain(d.frame(80, 24))
	require.Len(t, with, len(without), "no line added")
	require.Equal(t, "console   http://127.0.0.1:41234/s/demo · database: test", with[1])
	require.Contains(t, plain(d.frame(80, 12))[len(plain(d.frame(80, 12)))-1], "console, database and traces lines",
		"a tiny terminal says it hid the console's line")
}

// The first status line said "(0/s)" before any rate was measured, and
// the last one ended with an empty "owners " (issue 15).
func TestStatusLineBeforeARateAndWithoutOwners(t *testing.T) {
	t.Parallel()
	d := busyDemo(t, 4)
	require.Contains(t, d.statusLine(), "handled 0 (-/s)")
	d.cur.in.Rows = nil
	require.True(t, strings.HasSuffix(d.statusLine(), "owners none"), d.statusLine())
}

// During a resize the view shows the state and both generations' buckets:
// the old one's drained buckets marked ∎, the new one's standing by …
// (issue 14).
func TestTheViewShowsAResize(t *testing.T) {
	t.Parallel()
	row := func(gen, b int, owner string, drained bool) inspect.BucketRow {
		r := inspect.BucketRow{Live: owner != "", Lag: 0}
		r.Bucket, r.Owner, r.Epoch, r.Generation, r.Slot, r.Drained = b, owner, 1, gen, gen*65536+b, drained
		return r
	}
	rows := []inspect.BucketRow{row(0, 0, "", true), row(0, 1, "w1", false)}
	for b := range 4 {
		rows = append(rows, row(1, b, "w2", false))
	}
	d := testDemo(t, rows, []leasestore.WorkerState{{Worker: "w1", Live: true}, {Worker: "w2", Live: true}})
	d.cur.in.Buckets = 2
	d.cur.in.Resize = leasestore.Resize{Generation: 0, Buckets: 2, State: leasestore.ResizeSwitched, NextBuckets: 4,
		Cut: 812, CutDecided: true,
		Old: []leasestore.SlotStatus{{Bucket: 0, Slot: 0, Drained: true}, {Bucket: 1, Slot: 1, Owner: "w1"}},
		New: []leasestore.SlotStatus{{Bucket: 0, Slot: 65536, Owner: "w2", Ready: true}, {Bucket: 1, Slot: 65537, Owner: "w2"},
			{Bucket: 2, Slot: 65538, Owner: "w2", Ready: true}, {Bucket: 3, Slot: 65539, Owner: "w2"}}}
	text := strings.Join(plain(d.frame(200, 0)), "\n")
	require.Contains(t, text, "resizing generation 0 → 1, 2 → 4 buckets, switched, cut 812, old drained 1/2, new ready 2/4")
	require.Contains(t, text, "NEW GENERATION 1")
	require.Regexp(t, `(?m)^\s+0 ∎ `, text, "old bucket 0 drained")
	require.Regexp(t, `\s1 w1 `, text)
	require.Regexp(t, `\b1 w2…`, text, "new bucket 1 stands by")
	require.Regexp(t, `\b2 w2 `, text, "new bucket 2 is ready")
	compact := strings.Join(plain(d.frame(80, 24)), "\n")
	require.Contains(t, compact, "(compact), new generation 1")

	// The log follows the resize from sample to sample.
	steady := leasestore.Resize{Generation: 0, Buckets: 2, State: leasestore.ResizeSteady}
	d.resizeProgress(steady, leasestore.Resize{Generation: 0, Buckets: 2, State: leasestore.ResizeSealing, NextBuckets: 4})
	d.resizeProgress(d.cur.in.Resize, leasestore.Resize{Generation: 1, Buckets: 4, State: leasestore.ResizeSteady})
	var logged []string
	for _, e := range d.log {
		logged = append(logged, e.kind+" "+e.text)
	}
	require.Equal(t, []string{"resize sealing: the holders of the 2 old buckets propose a cut",
		"resize done: generation 1 serves with 4 buckets (the old generation ended at position 812)"}, logged)
}

// After a resize the owner lines say which generation their buckets are
// of: bucket 0 of generation 1 is not generation 0's bucket 0.
func TestOwnerLinesNameTheGenerationAfterAResize(t *testing.T) {
	t.Parallel()
	row := func(b int) inspect.BucketRow {
		r := inspect.BucketRow{Live: true}
		r.Generation, r.Bucket, r.Owner, r.Epoch = 1, b, "w2", 1
		return r
	}
	d := testDemo(t, []inspect.BucketRow{row(0), row(1)}, []leasestore.WorkerState{{Worker: "w2", Live: true}})
	d.cur.in.Resize.Generation = 1
	d.ownership(nil, d.cur)
	require.Contains(t, strings.Join(plain(d.frame(200, 0)), "\n"), "w2 took 0 1 of generation 1")

	r0 := inspect.BucketRow{Live: true}
	r0.Owner, r0.Epoch = "w3", 1
	d0 := testDemo(t, []inspect.BucketRow{r0}, []leasestore.WorkerState{{Worker: "w3", Live: true}})
	d0.ownership(nil, d0.cur)
	text := strings.Join(plain(d0.frame(200, 0)), "\n")
	require.Contains(t, text, "w3 took 0")
	require.NotContains(t, text, "generation")
}
