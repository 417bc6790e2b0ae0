package actors

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/internal/overflow"
)

// observed formats as f's result at the time the message is formatted:
// a failure message of pgtest.Eventually given observed(rec.distinct)
// reports what was seen after the wait, not before it.
func observed[T any](f func() T) fmt.Formatter { return observedValue[T](f) }

type observedValue[T any] func() T

func (f observedValue[T]) Format(s fmt.State, verb rune) {
	fmt.Fprintf(s, fmt.FormatString(s, verb), f())
}

// diagnose describes a worker's state for a failure message: its
// sequencer, publisher and readers, and the store's sequencing, checkpoint
// and lease rows. It reads the actors' state on their own goroutines and
// gives up on one that does not answer within a few seconds (a stuck
// mailbox is itself a finding).
func (w *testWorker) diagnose() string {
	var b strings.Builder
	b.WriteString(w.diagnoseProcess())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := w.rt.store.QuotedSchema()
	for _, query := range []string{
		`SELECT last_position, low_seq FROM ` + q + `.sequencer`,
		`SELECT count(*) AS unsequenced, coalesce(min(seq), 0) AS oldest_seq FROM ` + q + `.appends WHERE last_position IS NULL`,
		`SELECT count(*) AS appends, coalesce(max(last_position), 0) AS last_position FROM ` + q + `.appends`,
		`SELECT * FROM ` + q + `.checkpoints ORDER BY 1, 2`,
		`SELECT * FROM ` + q + `.lease_buckets ORDER BY 1, 2`,
		`SELECT * FROM ` + q + `.lease_workers ORDER BY 1, 2`,
		`SELECT * FROM ` + q + `.subscriptions ORDER BY 1`,
	} {
		b.WriteString("\n  " + query + ":" + dumpRows(ctx, w, query))
	}
	return b.String()
}

// diagnoseProcess is the worker's part of diagnose: its sequencer,
// publisher and readers, without the store's rows.
func (w *testWorker) diagnoseProcess() string {
	var b strings.Builder
	rt := w.rt
	st := rt.sequencer.Stats()
	fmt.Fprintf(&b, "\nworker %s: published %d; sequencer head %d, failing %d (%v), stuck %v, backlog age %v, attempts %d, last progress %v ago",
		w.name, rt.published.Load(), st.Head, st.Failing, st.LastError, st.Stuck, st.BacklogAge, st.Attempts,
		time.Since(st.LastProgress).Round(time.Millisecond))
	if w.group != nil {
		for _, line := range w.inspectReaders() {
			b.WriteString("\n  " + line)
		}
	}
	return b.String()
}

// inspectReaders describes the group's readers as they see themselves.
func (w *testWorker) inspectReaders() []string {
	g := w.group.g
	// A copy of each readerRef's fields, taken on the coordinator's
	// goroutine.
	type ref struct {
		bucket int
		r      struct {
			pid                *actor.PID
			epoch              int64
			queue              *overflow.Queue
			draining, stopping bool
		}
	}
	refs := make(chan []ref, 1)
	w.sys.Root.Send(w.group.coordinator, inspectCoordinator(func(c *coordinator) {
		var out []ref
		for b, r := range c.readers {
			x := ref{bucket: b}
			x.r.pid, x.r.epoch, x.r.queue = r.pid, r.epoch, r.queue
			if p := c.plan.Readers[b]; p != nil {
				x.r.draining, x.r.stopping = p.Draining, p.Stopping
			}
			out = append(out, x)
		}
		refs <- out
	}))
	var lines []string
	select {
	case rs := <-refs:
		sort.Slice(rs, func(i, j int) bool { return rs[i].bucket < rs[j].bucket })
		if len(rs) == 0 {
			lines = append(lines, "coordinator: no reader")
		}
		for _, x := range rs {
			got := make(chan string, 1)
			w.sys.Root.Send(x.r.pid, inspectReader(func(r *reader) { got <- r.describe() }))
			select {
			case s := <-got:
				lines = append(lines, fmt.Sprintf("slot %d (epoch %d, draining %v, stopping %v): %s", x.bucket, x.r.epoch, x.r.draining, x.r.stopping, s))
			case <-time.After(5 * time.Second):
				lines = append(lines, fmt.Sprintf("slot %d: the reader did not answer in 5 s; queue %+v", x.bucket, x.r.queue.Stats()))
			}
		}
	case <-time.After(5 * time.Second):
		lines = append(lines, "the coordinator did not answer in 5 s")
	}
	g.mu.Lock()
	lines = append(lines, fmt.Sprintf("group: owned %v, handoff %v, progress %v, reader states %v, pass error %v, renewed %v ago",
		keys(g.owned), g.handoff, g.progress, g.readerStates, g.passErr, time.Since(g.renewedAt).Round(time.Millisecond)))
	g.mu.Unlock()
	return lines
}

func keys[V any](m map[int]V) []int {
	out := make([]int, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Ints(out)
	return out
}

// describe is the reader's state in one line.
func (r *reader) describe() string {
	win, oldest := "none", time.Duration(0)
	if r.ws.st != nil {
		win = r.ws.st.String()
	}
	for _, ws := range r.ws.out {
		oldest = max(oldest, time.Since(ws.sentAt).Round(time.Millisecond))
	}
	return fmt.Sprintf("feed %s checkpoint %v "+
		"pending %d window %d %s (oldest delivery sent %v ago) handler %v probe %d draining %v stopped %v unsure %v overflowed %v store failures %d queue %+v "+
		"resize %s",
		r.feed, r.cp,
		len(r.feed.Pending()), r.inFlight(), win, oldest, r.handler != nil, r.probe, r.draining, r.stopped, r.unsure, r.overflowed,
		r.storeFailures, r.queue.Stats(), r.part.String())
}

// dumpRows runs query on the worker's pool and renders its rows as JSON.
func dumpRows(ctx context.Context, w *testWorker, query string) string {
	rows, err := w.pool.Query(ctx, `SELECT row_to_json(r)::text FROM (`+query+`) r`)
	if err != nil {
		return " " + err.Error()
	}
	vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return " " + err.Error()
	}
	var b strings.Builder
	for _, v := range vals {
		b.WriteString("\n    " + v)
	}
	if len(vals) == 0 {
		b.WriteString(" (none)")
	}
	return b.String()
}

// owners is ownedBy(ws...) as observed when the message is formatted.
func owners(ws ...*testWorker) fmt.Formatter {
	return observed(func() map[string][]int { return ownedBy(ws...) })
}
