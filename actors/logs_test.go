package actors

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// logRecord is one record a logCapture took: its level, message, and its
// keys in order — those the logger was made With, then the record's own —
// with their values as text. Groups prefix their keys ("g.key").
type logRecord struct {
	level slog.Level
	msg   string
	keys  []string
	vals  map[string]string
}

// logCapture is a slog.Handler keeping every record, at every level.
type logCapture struct {
	mu     *sync.Mutex
	recs   *[]logRecord
	attrs  []slog.Attr // from WithAttrs, keys already prefixed
	prefix string      // from WithGroup
}

func newLogCapture() *logCapture { return &logCapture{mu: &sync.Mutex{}, recs: &[]logRecord{}} }

func (h *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (h *logCapture) Handle(_ context.Context, r slog.Record) error {
	rec := logRecord{level: r.Level, msg: r.Message, vals: map[string]string{}}
	add := func(a slog.Attr) {
		rec.keys = append(rec.keys, a.Key)
		rec.vals[a.Key] = a.Value.String()
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(func(a slog.Attr) bool {
		for _, f := range flatten(h.prefix, a) {
			add(f)
		}
		return true
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	*h.recs = append(*h.recs, rec)
	return nil
}

func (h *logCapture) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = slices.Clone(h.attrs)
	for _, a := range as {
		c.attrs = append(c.attrs, flatten(h.prefix, a)...)
	}
	return &c
}

func (h *logCapture) WithGroup(name string) slog.Handler {
	c := *h
	c.prefix = h.prefix + name + "."
	return &c
}

// flatten turns a group attribute into its members, keys prefixed.
func flatten(prefix string, a slog.Attr) []slog.Attr {
	a.Value = a.Value.Resolve()
	if a.Value.Kind() != slog.KindGroup {
		return []slog.Attr{{Key: prefix + a.Key, Value: a.Value}}
	}
	var out []slog.Attr
	for _, m := range a.Value.Group() {
		out = append(out, flatten(prefix+a.Key+".", m)...)
	}
	return out
}

// records returns the records taken so far.
func (h *logCapture) records() []logRecord {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(*h.recs)
}

// warnings returns the Warn records whose message starts with prefix.
func (h *logCapture) warnings(prefix string) []logRecord {
	var out []logRecord
	for _, r := range h.records() {
		if r.level == slog.LevelWarn && strings.HasPrefix(r.msg, prefix) {
			out = append(out, r)
		}
	}
	return out
}

// startLoggedWorker starts a worker whose runtime (and so its group, its
// lease store and its telemetry) logs to logs.
func startLoggedWorker(t *testing.T, schema, name string, o GroupOptions, logs *logCapture) *testWorker {
	t.Helper()
	ctx := context.Background()
	w := &testWorker{name: name, sys: quietSystem(), pool: pgtest.NewPool(t, 12)}
	store, err := eventsource.New(w.pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	w.rt, err = startedRuntime(ctx, w.sys, store, RuntimeOptions{Logger: slog.New(logs), PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	o.Worker = name
	w.group, err = w.rt.StartGroup(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() { w.stop(t) })
	return w
}

// TestNoLogRecordRepeatsAKey runs a group through what makes it log —
// claims, a handler's panic (a supervision decision), a wrong answer, a
// late one, dead letters, a graceful stop — and checks that no record
// carries the same key twice ("subscription=a subscription=a").
func TestNoLogRecordRepeatsAKey(t *testing.T) {
	t.Parallel()
	store, schema := newTestStore(t)
	for _, typ := range []string{"Panic", "Wrong", "Silent", "Fine"} {
		appendOne(t, store, "acct-"+typ, typ, `{}`)
	}
	logs := newLogCapture()
	o := groupOpts("logkeys", 2, nil, "w")
	o.Retry = fastRetry(2)
	o.HandlerTimeout = 200 * time.Millisecond
	o.Handler = actor.PropsFromFunc(func(c actor.Context) {
		d, ok := c.Message().(*Delivery)
		if !ok {
			return
		}
		switch d.Event.Type {
		case "Panic":
			panic("boom")
		case "Wrong":
			c.Respond("done")
		case "Silent":
		default:
			c.Respond(Ack{})
		}
	})
	w := startLoggedWorker(t, schema, "w", o, logs)
	pgtest.Eventually(t, waitLong, func() bool {
		dls, err := store.DeadLetters(context.Background(), "logkeys", eventsource.DeadLetterFilter{})
		return err == nil && len(dls) >= 3
	}, "the panicking, wrong and silent events are dead-lettered")
	w.stop(t)

	recs := logs.records()
	require.NotEmpty(t, recs)
	for _, r := range recs {
		seen := map[string]bool{}
		for _, k := range r.keys {
			require.False(t, seen[k], "record %q repeats the key %q: %v", r.msg, k, r.keys)
			seen[k] = true
		}
	}
}

// TestABadAnswerIsWarnedOncePerBucket: a handler that answers a delivery
// with something else than an answer, or does not answer at all, gets one
// Warn per bucket saying what to do, however many events it fails.
func TestABadAnswerIsWarnedOncePerBucket(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, sub, warning string
		batch              bool
		answer             func(c actor.Context)
		advice             []string
	}{
		{name: "AWrongType", sub: "wrongtype", warning: msgWrongAnswer, answer: func(c actor.Context) { c.Respond("done") },
			advice: []string{"ctx.Respond(actors.Ack{})", "actors.Func"}},
		{name: "AnAckToABatch", sub: "wrongbatch", warning: msgWrongAnswer, batch: true, answer: func(c actor.Context) { c.Respond(Ack{}) },
			advice: []string{"actors.BatchAck", "actors.BatchFunc"}},
		{name: "NoAnswer", sub: "noanswer", warning: msgNoAnswer, answer: func(actor.Context) {},
			advice: []string{"ctx.Respond", "HandlerTimeout"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			store, schema := newTestStore(t)
			seed(t, store, "acct", 20, 40)
			logs := newLogCapture()
			o := groupOpts(c.sub, 2, nil, "w")
			o.Retry = fastRetry(2)
			o.HandlerTimeout = 200 * time.Millisecond
			if c.batch {
				o.Batch.MaxEvents = 3
			}
			o.Handler = actor.PropsFromFunc(func(ctx actor.Context) {
				switch ctx.Message().(type) {
				case *Delivery, *Batch:
					c.answer(ctx)
				}
			})
			startLoggedWorker(t, schema, "w", o, logs)
			perBucket := map[int]int{}
			pgtest.Eventually(t, waitLong, func() bool {
				dls, err := store.DeadLetters(context.Background(), c.sub, eventsource.DeadLetterFilter{})
				clear(perBucket)
				for _, dl := range dls {
					perBucket[dl.Bucket]++
				}
				return err == nil && perBucket[0] >= 3 && perBucket[1] >= 3
			}, "several events of each bucket dead-lettered: %v", observed(func() map[int]int { return perBucket }))

			warned := map[string]int{}
			for _, r := range logs.warnings(c.warning) {
				warned[r.vals["bucket"]]++
				for _, a := range c.advice {
					require.Contains(t, r.msg, a, "the warning says what to do")
				}
			}
			require.Equal(t, map[string]int{"0": 1, "1": 1}, warned, "one warning per bucket")
		})
	}
}
