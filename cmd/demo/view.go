package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"golang.org/x/term"

	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/redact"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
)

// sample is one reading of the database: the subscription's buckets and
// the sink's counts per worker.
type sample struct {
	at         time.Time
	in         inspect.Inspection
	handled    int64            // distinct events in the sink
	deliveries int64            // sink deliveries, duplicates included
	byWorker   map[string]int64 // distinct events first handled by each worker
}

// poll reads a sample, logs the ownership changes since the last one and
// updates the rates.
func (d *demo) poll() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	in, err := inspect.Inspect(ctx, d.db.store, subscription, category)
	if err != nil {
		d.warnOnce("poll", "reading the subscription's state failed: %s", redact.URL(err.Error()))
		return
	}
	s := &sample{at: time.Now(), in: in, byWorker: map[string]int64{}}
	rows, _ := d.db.pool.Query(ctx, `SELECT worker, count(*), sum(deliveries) FROM `+
		pgx.Identifier{d.db.schema}.Sanitize()+`.sink WHERE subscription = $1 GROUP BY worker`, subscription)
	for rows.Next() {
		var w string
		var n, dl int64
		if err := rows.Scan(&w, &n, &dl); err != nil {
			break
		}
		s.byWorker[w] = n
		s.handled += n
		s.deliveries += dl
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		d.warnOnce("sink", "reading the sink failed: %s", redact.URL(err.Error()))
		return
	}
	prev := d.cur
	d.cur = s
	if prev == nil {
		d.ownership(nil, s)
		return
	}
	d.resizeProgress(prev.in.Resize, s.in.Resize)
	d.ownership(prev, s)
	if dt := s.at.Sub(prev.at).Seconds(); dt > 0 {
		d.rate = smooth(d.rate, float64(s.handled-prev.handled)/dt)
		d.rated = true
		for w, n := range s.byWorker {
			d.wrate[w] = smooth(d.wrate[w], float64(n-prev.byWorker[w])/dt)
		}
	}
}

func smooth(old, now float64) float64 { return 0.6*old + 0.4*now }

func (d *demo) warnOnce(key, format string, args ...any) {
	if d.warned[key] {
		return
	}
	d.warned[key] = true
	d.logf("warn", format, args...)
}

// resizeProgress logs each step of a resize between two samples.
func (d *demo) resizeProgress(prev, cur leasestore.Resize) {
	switch {
	case cur.Generation != prev.Generation:
		d.logf("resize", "done: generation %d serves with %d buckets (the old generation ended at position %d)",
			cur.Generation, cur.Buckets, prev.Cut)
	case cur.State == prev.State:
	case cur.State == leasestore.ResizeSealing:
		d.logf("resize", "sealing: the holders of the %d old buckets propose a cut", cur.Buckets)
	case cur.State == leasestore.ResizeCut:
		d.logf("resize", "cut at position %d: the old buckets drain to it", cur.Cut)
	case cur.State == leasestore.ResizeSwitched:
		d.logf("resize", "switched: new buckets start as their old ones drain (%s)", resizeCounts(cur))
	case cur.State == leasestore.ResizeSteady:
		d.logf("resize", "cancelled: %d buckets, generation %d", cur.Buckets, cur.Generation)
	}
}

// resizeCounts is a resize's drained and ready counts.
func resizeCounts(r leasestore.Resize) string {
	drained, ready := 0, 0
	for _, s := range r.Old {
		if s.Drained {
			drained++
		}
	}
	for _, s := range r.New {
		if s.Ready {
			ready++
		}
	}
	return fmt.Sprintf("old drained %d/%d, new ready %d/%d", drained, len(r.Old), ready, len(r.New))
}

// generations splits an inspection's rows into the serving generation's
// and, during a resize, the next one's.
func generations(in inspect.Inspection) (serving, next []inspect.BucketRow) {
	for _, r := range in.Rows {
		switch r.Generation {
		case in.Resize.Generation:
			serving = append(serving, r)
		case in.Resize.Generation + 1:
			next = append(next, r)
		}
	}
	return serving, next
}

// ownership logs the buckets of the serving generation whose effective
// owner (one with an unexpired lease) changed between two samples, grouped
// by who took them. Across a resize's completion the bucket numbers are
// another generation's: nothing is compared. After a resize each line
// names the generation its buckets are of ("w2 took 0 1 of generation 1
// from w3"); generation 0's lines read as they always did.
func (d *demo) ownership(prev, cur *sample) {
	type key struct{ to, from, how string }
	moved := map[key][]int{}
	var keys []key
	prevOwner := map[int]inspect.BucketRow{}
	if prev != nil {
		if prev.in.Resize.Generation != cur.in.Resize.Generation {
			return
		}
		serving, _ := generations(prev.in)
		for _, r := range serving {
			prevOwner[r.Bucket] = r
		}
	}
	serving, _ := generations(cur.in)
	for _, r := range serving {
		p := prevOwner[r.Bucket]
		was, now := effective(p), effective(r)
		if was == now && (now == "" || p.Epoch == r.Epoch) {
			continue
		}
		var k key
		switch {
		case now != "":
			k = key{to: now, from: was, how: "took"}
		case r.Owner == "":
			k = key{from: was, how: "released"}
		default:
			k = key{from: was, how: "expired"}
		}
		if _, ok := moved[k]; !ok {
			keys = append(keys, k)
		}
		moved[k] = append(moved[k], r.Bucket)
	}
	for _, k := range keys {
		list := joinInts(moved[k])
		if g := cur.in.Resize.Generation; g > 0 {
			list += fmt.Sprintf(" of generation %d", g)
		}
		switch k.how {
		case "took":
			from := ""
			if k.from != "" {
				from = " from " + k.from
			}
			d.logf("owner", "%s took %s%s", k.to, list, from)
		case "released":
			d.logf("owner", "%s released %s", k.from, list)
		case "expired":
			d.logf("owner", "%s's lease on %s expired", k.from, list)
		}
	}
}

// effective is a bucket's owner if its lease is unexpired, else "".
func effective(r inspect.BucketRow) string {
	if r.Live {
		return r.Owner
	}
	return ""
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, " ")
}

// render draws the live view, or in plain mode prints a status line every
// second.
func (d *demo) render() {
	if !d.tui {
		if d.cur != nil && time.Since(d.lastLine) >= time.Second {
			d.lastLine = time.Now()
			fmt.Fprintf(d.out, "%7.1fs  %-7s %s\n", time.Since(d.start).Seconds(), "status", d.statusLine())
		}
		return
	}
	w, h := d.screen.size()
	d.screen.draw(d.frame(w, h))
}

// statusLine is plain mode's periodic summary.
func (d *demo) statusLine() string {
	s := d.cur
	owned := s.in.OwnedBy()
	var names []string
	for w := range owned {
		names = append(names, w)
	}
	sort.Strings(names)
	owners := "none"
	if len(names) > 0 {
		var parts []string
		for _, w := range names {
			parts = append(parts, fmt.Sprintf("%s:%d", termsafe.String(w), owned[w]))
		}
		owners = strings.Join(parts, " ")
	}
	var lag int64
	for _, r := range s.in.Rows {
		lag += max(r.Lag, 0)
	}
	return fmt.Sprintf("appended %d · handled %d (%s) · duplicates %d · lag %d · %s · owners %s",
		d.prod.appended.Load(), s.handled, d.rateText(), s.deliveries-s.handled, lag, generationText(s.in), owners)
}

// generationText is the serving generation and the resize, if one runs.
func generationText(in inspect.Inspection) string {
	r := in.Resize
	if !r.Resizing() {
		return fmt.Sprintf("generation %d, %d buckets", r.Generation, in.Buckets)
	}
	cut := "cut not decided"
	if r.CutDecided {
		cut = fmt.Sprintf("cut %d", r.Cut)
	}
	return fmt.Sprintf("resizing generation %d → %d, %d → %d buckets, %s, %s, %s", r.Generation, r.Generation+1,
		r.Buckets, r.NextBuckets, r.State, cut, resizeCounts(r))
}

// layout is how much of the live view to show.
type layout struct {
	compact     bool // the bucket map as owner cells, several buckets a line
	hideStopped bool // only running and leaving workers
	terse       bool // no database and traces lines, no blank lines
	logLines    int  // the last events shown
}

// layouts are tried in order until the frame fits the terminal's height.
var layouts = []layout{
	{logLines: 8},
	{compact: true, logLines: 8},
	{compact: true, hideStopped: true, logLines: 8},
	{compact: true, hideStopped: true, logLines: 5},
	{compact: true, hideStopped: true, logLines: 3},
	{compact: true, hideStopped: true, terse: true, logLines: 3},
	{compact: true, hideStopped: true, terse: true, logLines: 1},
}

// frame is the live view, one string per line, at most height-1 lines (the
// line after it holds the cursor; height 0: no limit). When the full view
// is too tall it shows the bucket map compact, hides stopped workers and
// older events, in that order, and says what it cut.
func (d *demo) frame(width, height int) []string {
	if height <= 0 {
		lines, _ := d.frameWith(width, 0, layouts[0])
		return lines
	}
	budget := max(height-1, 1)
	var lines []string
	for i, l := range layouts {
		var hidden int
		lines, hidden = d.frameWith(width, budget, l)
		// Buckets are cut only when nothing else is left to cut.
		if len(lines) <= budget && (hidden == 0 || i == len(layouts)-1) {
			return lines
		}
	}
	// A tiny terminal: the top of the view, and the note on what was cut.
	return append(lines[:budget-1:budget-1], lines[len(lines)-1])
}

// frameWith draws the view with layout l; budget (0: none) bounds the
// compact bucket map, which shows as many rows as fit. It returns the
// lines and how many buckets did not fit.
func (d *demo) frameWith(width, budget int, l layout) ([]string, int) {
	c := colors(os.Getenv("NO_COLOR") == "")
	var lines []string
	add := func(format string, args ...any) {
		if line := fmt.Sprintf(format, args...); line != "" || !l.terse {
			lines = append(lines, line)
		}
	}
	elapsed := time.Since(d.start).Truncate(100 * time.Millisecond)
	clock := elapsed.String()
	if d.cfg.duration > 0 {
		clock += " / " + d.cfg.duration.String()
	}
	buckets := fmt.Sprintf("%d buckets", d.cfg.buckets)
	if d.cur != nil && d.cur.in.Resize.Generation > 0 {
		buckets = fmt.Sprintf("generation %d, %d buckets", d.cur.in.Resize.Generation, d.cur.in.Buckets)
	}
	add("%skumi demo%s  %s [%s]  subscription %s on %s · %s · %s leases, ttl %v",
		c.bold, c.reset, clock, d.phase, subscription, category, buckets, d.cfg.lease, d.cfg.ttl)
	if !l.terse {
		if d.console != "" { // first, so that a narrow terminal cuts the database's description, not the URL
			add("%sconsole%s   %s · database: %s", c.dim, c.reset, d.console, d.db.describe)
		} else {
			add("%sdatabase%s  %s", c.dim, c.reset, d.db.describe)
		}
		add("%straces%s    %s", c.dim, c.reset, d.tracing)
	}
	if d.cur == nil {
		add("")
		add("waiting for the first reading…")
		return lines, 0
	}
	s := d.cur
	var lag int64
	for _, r := range s.in.Rows {
		lag += max(r.Lag, 0)
	}
	add("%sproducer%s  %d appended at %d/s target · head position %d · lag %d", c.dim, c.reset, d.prod.appended.Load(),
		d.cfg.rate, s.in.Head, lag)
	add("%shandled%s   %d distinct (%s) · %d deliveries · %d duplicates", c.dim, c.reset, s.handled, d.rateText(),
		s.deliveries, s.deliveries-s.handled)
	if s.in.Resize.Resizing() {
		add("%sresize%s    %s", c.dim, c.reset, generationText(s.in))
	}
	add("")

	var cut []string
	owned := s.in.OwnedBy()
	inPool := map[string]bool{}
	for _, w := range s.in.Workers {
		inPool[w.Worker] = w.Live && !w.SessionGone
	}
	add("%sWORKER  PID      STATE     POOL    BUCKETS  HANDLED  RATE%s", c.bold, c.reset)
	stopped := 0
	for _, p := range d.fleet.all() {
		state := p.State()
		if l.hideStopped && state != stateRunning && state != stateLeaving {
			stopped++
			continue
		}
		pool := "-"
		if live, ok := inPool[p.name]; ok {
			pool = map[bool]string{true: "live", false: "lapsed"}[live]
		}
		rate := d.wrate[p.name]
		if state != stateRunning && state != stateLeaving {
			rate = 0
		}
		add("%s  %-7d  %-8s  %-6s  %7d  %7d  %4.0f/s", c.worker(p.name, fmt.Sprintf("%-6s", p.name)), p.Pid(),
			state, pool, owned[p.name], s.byWorker[p.name], rate)
	}
	if stopped > 0 {
		cut = append(cut, fmt.Sprintf("%d stopped workers", stopped))
	}
	if l.terse && d.console != "" {
		cut = append(cut, "console, database and traces lines")
	} else if l.terse {
		cut = append(cut, "database and traces lines")
	}
	add("")

	// What follows the bucket map: its legend, the final count, the events
	// and the keys; the compact map gets the lines left.
	var tail []string
	addTail := func(format string, args ...any) {
		if line := fmt.Sprintf(format, args...); line != "" || !l.terse {
			tail = append(tail, line)
		}
	}
	addTail("%s→ handing over to a claimant · ✗ lease expired · ∎ drained to the cut · … new bucket standing by%s", c.dim, c.reset)
	addTail("")
	if d.final != nil && d.phase != "running" {
		addTail("missing %d of %d appended", d.final.Missing, d.final.Appended)
	}
	start := max(0, len(d.log)-l.logLines)
	if start > 0 && l.logLines < 8 {
		cut = append(cut, fmt.Sprintf("%d older events", min(start, 8-l.logLines)))
	}
	for _, e := range d.log[start:] {
		addTail("%s%7.1fs%s  %-7s %s", c.dim, e.at.Seconds(), c.reset, e.kind, e.text)
	}
	for range l.logLines - (len(d.log) - start) {
		addTail("")
	}
	if d.keys != nil && d.phase == "running" {
		addTail("%skeys: a add a worker · l graceful leave · k kill -9 the busiest · r resize · q finish%s", c.dim, c.reset)
	}

	hidden := 0
	serving, next := generations(s.in)
	standby := map[int]bool{}
	for _, b := range s.in.Resize.New {
		standby[b.Slot] = !b.Ready
	}
	if !l.compact {
		lines = append(lines, bucketTable(c, width, serving, standby)...)
		if len(next) > 0 {
			lines = append(lines, "", fmt.Sprintf("%sNEW GENERATION %d%s (%d buckets)", c.bold, s.in.Resize.Generation+1,
				c.reset, len(next)))
			lines = append(lines, bucketTable(c, width, next, standby)...)
		}
	} else {
		room := -1 // no limit
		if budget > 0 {
			room = max(budget-len(lines)-len(tail)-2, 0) // the map's heading and the note
		}
		var bmap []string
		bmap, hidden = bucketMap(c, width, room, serving, standby, "")
		lines = append(lines, bmap...)
		if len(next) > 0 {
			if room >= 0 {
				room = max(room-len(bmap)+1, 0)
			}
			var more int
			bmap, more = bucketMap(c, width, room, next, standby, fmt.Sprintf(", new generation %d", s.in.Resize.Generation+1))
			lines = append(lines, bmap...)
			hidden += more
		}
		cut = append([]string{"checkpoints and lag (kumi status)"}, cut...)
		if hidden > 0 {
			cut = append(cut, fmt.Sprintf("%d buckets", hidden))
		}
	}
	lines = append(lines, tail...)
	if len(cut) > 0 {
		lines = append(lines, fmt.Sprintf("%sfit to %d lines; hidden: %s%s", c.dim, budget+1, strings.Join(cut, ", "), c.reset))
	}
	return lines, hidden
}

// rateText is the smoothed delivery rate, or "-/s" before two readings
// have measured one.
func (d *demo) rateText() string {
	if d.rated {
		return fmt.Sprintf("%.0f/s", d.rate)
	}
	return "-/s"
}

// ownerText is a bucket's owner as the view shows it, with → for a pending
// claim and ✗ for an expired lease; during a resize ∎ for an old bucket
// drained to the cut, and … after the owner of a new one standing by
// (standby).
func ownerText(r inspect.BucketRow, standby bool) string {
	switch {
	case r.Drained:
		return "∎"
	case standby && r.Live:
		return termsafe.String(r.Owner) + "…"
	case r.Live && r.ClaimWorker != "":
		return termsafe.String(r.Owner) + "→"
	case r.Live:
		return termsafe.String(r.Owner)
	case r.Owner != "":
		return termsafe.String(r.Owner) + "✗"
	}
	return "-"
}

// bucketTable is the full bucket map of rows: a row per bucket, in
// columns; standby holds the slots of new buckets standing by.
func bucketTable(c palette, width int, rows []inspect.BucketRow, standby map[int]bool) []string {
	var lines []string
	const cell = 38
	cols := max(1, min(4, (width+2)/(cell+3)))
	head := fmt.Sprintf("%-6s %-6s %5s %10s %6s", "BUCKET", "OWNER", "EPOCH", "CHECKPOINT", "LAG")
	lines = append(lines, c.bold+strings.Repeat(head+"   ", cols-1)+head+c.reset)
	per := (len(rows) + cols - 1) / cols
	for i := range per {
		var cells []string
		for col := range cols {
			j := col*per + i
			if j >= len(rows) {
				break
			}
			r := rows[j]
			lag := "-"
			if r.Lag >= 0 {
				lag = strconv.FormatInt(r.Lag, 10)
			}
			cells = append(cells, fmt.Sprintf("%6d %s %5d %10d %6s", r.Bucket,
				c.worker(r.Owner, fmt.Sprintf("%-6s", ownerText(r, standby[r.Slot]))), r.Epoch, r.Checkpoint, lag))
		}
		lines = append(lines, strings.Join(cells, "   "))
	}
	return lines
}

// bucketMap is the compact bucket map of rows: "bucket owner" cells, as
// many a line as the width allows, in at most room lines (-1: no limit)
// after its heading (which ends with what). It returns the lines and how
// many buckets did not fit.
func bucketMap(c palette, width, room int, rows []inspect.BucketRow, standby map[int]bool, what string) ([]string, int) {
	digits, owner := 1, 1
	for _, r := range rows {
		digits = max(digits, len(strconv.Itoa(r.Bucket)))
		owner = max(owner, utf8.RuneCountInString(ownerText(r, standby[r.Slot])))
	}
	cell := digits + 1 + owner
	per := max(1, (width-1+2)/(cell+2))
	lines := []string{c.bold + "BUCKET OWNER" + c.reset + c.dim + " (compact)" + what + c.reset}
	shown := len(rows)
	if room >= 0 {
		shown = min(shown, room*per)
	}
	for i := 0; i < shown; i += per {
		var cells []string
		for _, r := range rows[i:min(i+per, shown)] {
			text := fmt.Sprintf("%-*s", owner, ownerText(r, standby[r.Slot]))
			cells = append(cells, fmt.Sprintf("%*d %s", digits, r.Bucket, c.worker(r.Owner, text)))
		}
		lines = append(lines, strings.Join(cells, "  "))
	}
	return lines, len(rows) - shown
}

// palette holds the escape sequences of the view (empty with NO_COLOR).
type palette struct {
	bold, dim, reset string
	on               bool
}

func colors(on bool) palette {
	if !on {
		return palette{}
	}
	return palette{bold: "\x1b[1m", dim: "\x1b[2m", reset: "\x1b[0m", on: true}
}

// worker colours text by the worker id it names ("w3").
func (p palette) worker(id, text string) string {
	if !p.on || len(id) < 2 || id[0] != 'w' {
		return text
	}
	n, err := strconv.Atoi(id[1:])
	if err != nil {
		return text
	}
	codes := []string{"36", "33", "35", "32", "34", "31", "96", "93", "95", "92"}
	return "\x1b[" + codes[(n-1)%len(codes)] + "m" + text + "\x1b[0m"
}

// screen redraws a frame in place: it moves the cursor back up over the
// previous frame and overwrites it, so the terminal's scroll-back keeps
// what came before and the last frame stays when the demo ends.
type screen struct {
	out    io.Writer
	fd     int
	height int // lines of the previous frame
	closed bool
}

func newScreen(out io.Writer) *screen {
	s := &screen{out: out, fd: -1}
	if f, ok := out.(*os.File); ok {
		s.fd = int(f.Fd())
	}
	fmt.Fprint(out, "\x1b[?25l") // hide the cursor
	return s
}

// size is the terminal's width and height (100 by 0, no limit, when it
// cannot say).
func (s *screen) size() (width, height int) {
	if s.fd >= 0 {
		if w, h, err := term.GetSize(s.fd); err == nil && w > 0 {
			return w, max(h, 0)
		}
	}
	return 100, 0
}

func (s *screen) draw(lines []string) {
	if s.closed {
		return
	}
	w, _ := s.size()
	var b strings.Builder
	if s.height > 0 {
		fmt.Fprintf(&b, "\r\x1b[%dA", s.height)
	}
	for _, l := range lines {
		b.WriteString(truncate(l, w-1))
		b.WriteString("\x1b[K\r\n") // \r: in raw mode \n does not return
	}
	b.WriteString("\x1b[J")
	s.height = len(lines)
	_, _ = io.WriteString(s.out, b.String())
}

// close shows the cursor again; the last frame stays on the screen.
func (s *screen) close() {
	if s.closed {
		return
	}
	s.closed = true
	fmt.Fprint(s.out, "\x1b[?25h")
}

// truncate cuts s to n visible columns, keeping escape sequences whole.
func truncate(s string, n int) string {
	var b strings.Builder
	visible := 0
	cut := false
	for i := 0; i < len(s); {
		if s[i] == 0x1b {
			j := i + 1
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e || s[j] == '[') {
				j++
			}
			if j < len(s) {
				j++
			}
			b.WriteString(s[i:j])
			i = j
			continue
		}
		_, size := utf8.DecodeRuneInString(s[i:])
		if visible >= n {
			cut = true
			i += size
			continue
		}
		b.WriteString(s[i : i+size])
		visible++
		i += size
	}
	if cut {
		b.WriteString("\x1b[0m")
	}
	return b.String()
}
