package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/worker"
	"github.com/kumi-run/kumi/leasestore"
)

// hostile is a worker id a terminal would act on: ESC, BEL, CR, a C1
// CSI, DEL, a bidi override, a tab and a newline.
const hostile = "w\x1b[2J\a\r\u009b31m\x7f\u202eevil\tx\ny"

// testDemo is a demo with a sample of its own and no processes.
func testDemo(t *testing.T, rows []worker.BucketRow, members []leasestore.Member) *demo {
	t.Helper()
	d := &demo{cfg: config{buckets: len(rows), duration: time.Minute, lease: "row", ttl: time.Second},
		db: &database{describe: "test"}, fleet: &fleet{}, prod: &producer{}, phase: "running",
		wrate: map[string]float64{}, warned: map[string]bool{}, start: time.Now(), tui: true}
	d.cur = &sample{at: time.Now(), in: worker.Inspection{Buckets: len(rows), Rows: rows, Members: members},
		byWorker: map[string]int64{}}
	return d
}

func requireTermSafe(t *testing.T, lines []string) {
	t.Helper()
	for _, l := range lines {
		// The view's own colours are the only escape sequences.
		l = strings.NewReplacer("\x1b[1m", "", "\x1b[2m", "", "\x1b[0m", "").Replace(l)
		for _, r := range l {
			require.False(t, worker.TermUnsafe(r), "%q in %q", r, l)
		}
	}
}

// Worker ids come from the database: the live view, the status line and
// the event log show them escaped (issue 18 §5).
func TestViewEscapesWhatItReadsFromTheDatabase(t *testing.T) {
	t.Parallel()
	row := func(b int) worker.BucketRow {
		r := worker.BucketRow{Live: true, Lag: 0}
		r.Bucket, r.Owner, r.Epoch = b, hostile, 1
		return r
	}
	d := testDemo(t, []worker.BucketRow{row(0), row(1)}, []leasestore.Member{{Worker: hostile, Live: true}})
	d.ownership(nil, d.cur)
	lines := d.frame(200)
	requireTermSafe(t, lines)
	require.Contains(t, strings.Join(lines, "\n"), `\u202eevil\tx\ny took 0 1`)
	d.tui = false
	requireTermSafe(t, []string{d.statusLine()})
	require.Contains(t, d.statusLine(), `w\x1b[2J`)
}
