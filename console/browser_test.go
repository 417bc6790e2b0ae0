package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	cdplog "github.com/chromedp/cdproto/log"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// browserWait bounds every wait for the page to show something.
const browserWait = 60 * time.Second

// browser is a headless Chromium driven by chromedp, with every console
// error, uncaught exception and dialog the pages raise.
type browser struct {
	ctx    context.Context
	mu     sync.Mutex
	errors []string
}

// newBrowser starts Debian's chromium. It fails, never skips, when chromium
// is missing: CI installs it (.ci/run).
func newBrowser(t *testing.T) *browser {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("the browser tests need Chromium and it is not installed: apt-get install -y chromium " +
			"(.ci/run installs it in CI)")
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		// rebind.test stands for a name whose DNS now says 127.0.0.1.
		chromedp.Flag("host-resolver-rules", "MAP rebind.test 127.0.0.1"),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
	)
	b := &browser{}
	ctx, cancel := chromedp.NewContext(alloc, chromedp.WithListener(b.listen))
	b.ctx = ctx
	// The first Do starts the browser; it must have no timeout (it would
	// stop the browser).
	require.NoError(t, chromedp.Do(ctx), "start chromium")
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
	})
	return b
}

// listen records the console errors, uncaught exceptions, error entries of
// the browser log and dialogs (an alert would be injected script).
func (b *browser) listen(ev any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			b.errors = append(b.errors, "console."+string(ev.Type)+": "+strings.Join(args, " "))
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.errors = append(b.errors, fmt.Sprintf("exception: %s at %s:%d", msg, d.URL, d.LineNumber))
	case *cdplog.EventEntryAdded:
		if ev.Entry.Level == cdplog.EntryLevelError {
			b.errors = append(b.errors, "log: "+ev.Entry.Text+" "+ev.Entry.URL)
		}
	case *cdppage.EventJavascriptDialogOpening:
		b.errors = append(b.errors, "dialog: "+ev.Message)
	}
}

func (b *browser) run(t *testing.T, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserWait)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, actions...))
}

// eval evaluates a JavaScript expression (awaiting a promise) and returns
// its value.
func eval[T any](t *testing.T, b *browser, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, browserWait)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	require.NoError(t, err, expr)
	return v
}

// waitFor waits until the expression is true in the page.
func (b *browser) waitFor(t *testing.T, expr, msg string) {
	t.Helper()
	pgtest.Eventually(t, browserWait, func() bool { return eval[bool](t, b, expr) }, "%s (%s)", msg, expr)
}

// takeErrors returns and forgets the errors the pages raised so far.
func (b *browser) takeErrors() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.errors
	b.errors = nil
	return out
}

// browserWorker is one worker of the group under test: its own actor
// system, pool and runtime.
type browserWorker struct {
	rt    *actors.Runtime
	group *actors.Group
}

func startBrowserWorker(t *testing.T, schema, name string) *browserWorker {
	t.Helper()
	ctx := context.Background()
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	store, err := eventsource.New(pgtest.NewPool(t, 12), eventsource.Config{Schema: schema})
	require.NoError(t, err)
	rt, err := actors.New(sys, store, actors.RuntimeOptions{PollInterval: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, rt.Start(ctx))
	// A little work per event, so that lag shows on the map for a moment.
	handler := actor.PropsFromFunc(func(c actor.Context) {
		if _, ok := c.Message().(*actors.Delivery); ok {
			time.Sleep(2 * time.Millisecond)
			c.Respond(actors.Ack{})
		}
	})
	g, err := rt.StartGroup(ctx, actors.GroupOptions{Subscription: "live", Category: "acct", Buckets: 12,
		Worker: name, Handler: handler, CheckpointInterval: 50 * time.Millisecond,
		// Short enough that a killed worker's buckets move within the
		// test, long enough that a live worker's lease does not lapse on a
		// loaded machine (relinquish refuses an expired lease: CI saw it
		// with a 1.5 s TTL).
		Lease: leasestore.LeaseOptions{TTL: 4 * time.Second, Heartbeat: 400 * time.Millisecond, Margin: 1500 * time.Millisecond}})
	require.NoError(t, err)
	w := &browserWorker{rt: rt, group: g}
	t.Cleanup(func() { w.stop(t) })
	return w
}

func (w *browserWorker) stop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, w.rt.Stop(ctx))
}

// kill stops the worker without a graceful step: its leases stay until
// they expire, and the others take them.
func (w *browserWorker) kill(t *testing.T) {
	w.group.Abort()
	w.stop(t)
}

// owners is a JavaScript expression: the set of owners on the map, as a
// sorted, comma-separated string.
const owners = `[...new Set([...document.querySelectorAll('#map .cell')].map(c => c.dataset.owner))].sort().join(',')`

func TestTheConsoleInARealBrowser(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	letter := f.hostileLetter(t, "live")
	hostileSubLetter := f.hostileLetter(t, hostile)
	_, rw := f.serve(t, Options{AllowActions: true, Categories: map[string]string{"live": "acct"}})
	_, ro := f.serve(t, Options{Categories: map[string]string{"live": "acct"}})
	b := newBrowser(t)

	startBrowserWorker(t, f.schema, "alpha")
	b.run(t, chromedp.Navigate(rw.URL+"/s/live"))
	b.waitFor(t, `document.querySelectorAll('#map .cell').length === 12`, "the map shows the group's 12 buckets")
	b.waitFor(t, owners+` === 'alpha'`, "alpha owns every bucket")
	require.Empty(t, b.takeErrors(), "the page loads with no console errors")
	require.Equal(t, 1, eval[int](t, b, `document.scripts.length`), "one script, the console's own")

	parent := t
	t.Run("UpdatesWhenAWorkerJoins", func(t *testing.T) {
		startBrowserWorker(parent, f.schema, "beta") // lives on after this subtest
		b.waitFor(t, owners+` === 'alpha,beta'`, "beta's buckets appear without a reload")
		b.waitFor(t, `document.querySelector('#workers').textContent.includes('beta')`, "beta is listed as a worker")
		b.waitFor(t, `[...document.querySelectorAll('#timeline .k')].some(k => k.textContent === 'handoff')`,
			"the timeline shows the handoffs to beta")
	})

	gamma := startBrowserWorker(t, f.schema, "gamma")
	b.waitFor(t, owners+` === 'alpha,beta,gamma'`, "gamma takes its share")
	if path := os.Getenv("KUMI_SCREENSHOT"); path != "" {
		screenshot(t, f, b, path)
	}

	t.Run("UpdatesWhenAWorkerIsKilled", func(t *testing.T) {
		gamma.kill(t)
		b.waitFor(t, owners+` === 'alpha,beta'`, "the survivors take gamma's buckets once its leases expire")
		b.waitFor(t, `[...document.querySelectorAll('#timeline li')].some(li =>
			li.querySelector('.k')?.textContent === 'steal' && li.textContent.includes('gamma'))`,
			"the timeline shows the steals from gamma")
		ev := eval[string](t, b, `[...document.querySelectorAll('#timeline li')].find(li =>
			li.querySelector('.k')?.textContent === 'steal').querySelector('.ev').textContent`)
		require.Contains(t, ev, "gamma's lease", "a steal carries its evidence")
	})

	t.Run("AnEnabledActionWorks", func(t *testing.T) {
		b.run(t, chromedp.Navigate(rw.URL+"/s/live/letters/"+letter.EventID.String()))
		b.run(t, chromedp.Click(chromedp.ID("discard")))
		b.waitFor(t, `document.querySelector('#outcome').textContent.startsWith('discarded')`, "the discard is reported")
		_, err := f.store.DeadLetter(context.Background(), "live", letter.EventID)
		require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound)

		b.run(t, chromedp.Navigate(rw.URL+"/s/live"))
		b.waitFor(t, `document.querySelectorAll('#map .cell').length === 12`, "the map is back")
		b.waitFor(t, `![...document.querySelectorAll('#map .cell .b')].some(b => b.textContent.includes('→'))`,
			"no handoff is pending (relinquish refuses a bucket that has one)")
		b.run(t, chromedp.Click(chromedp.CSS(`#map .cell[data-owner="alpha"]`)))
		b.run(t, chromedp.Click(chromedp.ID("relinquish")))
		b.waitFor(t, `document.querySelector('#outcome') !== null`, "the relinquish is answered")
		out := eval[string](t, b, `document.querySelector('#outcome').className + ': ' + document.querySelector('#outcome').textContent`)
		require.Regexp(t, `^outcome good: asked alpha to hand bucket \d+`, out)

		// Reset a checkpoint of beta's: refused while beta holds it, done
		// when forced. What is typed survives the page's polls.
		b.run(t, chromedp.Click(chromedp.CSS(`#map .cell[data-owner="beta"]`)))
		b.run(t, chromedp.SetValue(chromedp.ID("reset-position"), "0"))
		stats := eval[string](t, b, `document.querySelector('#stats').textContent`)
		b.waitFor(t, `document.querySelector('#stats').textContent !== `+strconv.Quote(stats), "the page polled")
		require.Equal(t, "0", eval[string](t, b, `document.querySelector('#reset-position').value`))
		b.run(t, chromedp.Click(chromedp.ID("reset")))
		b.waitFor(t, `(document.querySelector('#outcome')?.textContent ?? '').includes('is held by beta')`, "refused unforced")
		var errs []string // the browser logs the refused request: wait for it, and for nothing else
		pgtest.Eventually(t, browserWait, func() bool { errs = append(errs, b.takeErrors()...); return len(errs) > 0 },
			"the browser logs the refused request")
		for _, e := range errs {
			require.Contains(t, e, "409", "the only error is the refused reset's: %s", e)
		}
		b.run(t, chromedp.Click(chromedp.ID("reset-force")))
		b.run(t, chromedp.Click(chromedp.ID("reset")))
		b.waitFor(t, `(document.querySelector('#outcome')?.className ?? '') === 'outcome good'`, "the forced reset is done")
		require.Regexp(t, `^bucket \d+: checkpoint \d+ -> 0; its live owner beta was fenced out`,
			eval[string](t, b, `document.querySelector('#outcome').textContent`))
	})

	t.Run("ADisabledActionIsRefused", func(t *testing.T) {
		id := hostileSubLetter.EventID.String()
		b.run(t, chromedp.Navigate(ro.URL+"/s/"+url.PathEscape(hostile)+"/letters/"+id))
		require.True(t, eval[bool](t, b, `document.querySelector('#discard').disabled`), "the button is disabled")
		status := eval[float64](t, b, fmt.Sprintf(`fetch('%s/api/s/%s/letters/%s/discard', {method: 'POST',
			headers: {'X-Kumi-Csrf': document.body.dataset.csrf}}).then(r => r.status)`,
			ro.URL, url.PathEscape(url.PathEscape(hostile)), id))
		require.EqualValues(t, 403, status, "the server refuses it too")
		_, err := f.store.DeadLetter(context.Background(), hostile, hostileSubLetter.EventID)
		require.NoError(t, err, "the letter is still there")
		for _, e := range b.takeErrors() {
			require.Contains(t, e, "403", "the only error is the refused request's: %s", e)
		}

		b.run(t, chromedp.Navigate(ro.URL+"/s/live"))
		b.waitFor(t, `document.querySelectorAll('#map .cell').length === 12`, "the read-only map")
		b.run(t, chromedp.Click(chromedp.CSS(`#map .cell`)))
		b.waitFor(t, `document.querySelector('#relinquish')?.disabled === true`, "relinquish is disabled")
		require.True(t, eval[bool](t, b, `document.querySelector('#reset').disabled`), "reset is disabled")
	})

	t.Run("AHostileStreamNameIsText", func(t *testing.T) {
		b.run(t, chromedp.Navigate(ro.URL+"/s/"+url.PathEscape(hostile)+"/letters"))
		require.Equal(t, "acct-"+hostile, eval[string](t, b, `document.querySelector('td.stream').textContent`))
		b.run(t, chromedp.Navigate(ro.URL+"/s/"+url.PathEscape(hostile)))
		b.waitFor(t, `document.querySelector('#letters').textContent === 'pending dead letters: 1'`, "the page polled")
		require.Equal(t, hostile, eval[string](t, b, `document.querySelector('h1 .name').textContent`))
		b.run(t, chromedp.Navigate(ro.URL+"/"))
		b.waitFor(t, `[...document.querySelectorAll('#overview a')].some(a => a.textContent === `+
			"`"+hostile+"`"+`)`, "the overview lists it as text")
		require.Equal(t, 1, eval[int](t, b, `document.scripts.length`), "no script got in")
	})

	t.Run("AParkedStreamIsListedAsTextAndReplayed", func(t *testing.T) {
		// The live workers do not park streams (their reader does not honour
		// parking yet): the test parks the hostile stream itself.
		_, err := f.store.ParkStream(context.Background(), eventsource.DeadLetter{Subscription: "live",
			EventID: letter.EventID, Reason: "handler: " + hostile, Attempts: 5}, nil)
		require.NoError(t, err)
		b.run(t, chromedp.Navigate(rw.URL+"/s/live"))
		b.waitFor(t, `[...document.querySelectorAll('#parked tr')].some(tr => tr.dataset.stream === `+
			"`acct-"+hostile+"`"+`)`, "the parked stream is listed")
		require.Equal(t, "handler: "+hostile, eval[string](t, b, `document.querySelector('#parked tr td:last-child').textContent`),
			"its reason is text")
		b.run(t, chromedp.Click(chromedp.CSS(`#parked tr`)))
		require.Equal(t, "acct-"+hostile, eval[string](t, b, `document.querySelector('#parked-stream').value`),
			"a click on the row picks its stream")
		b.run(t, chromedp.Click(chromedp.ID("parked-replay")))
		b.waitFor(t, `(document.querySelector('#parked-actions .outcome')?.className ?? '') === 'outcome good'`,
			"the replay is asked")
		b.waitFor(t, `document.querySelector('#parked tr td:nth-child(5)').textContent.startsWith('replay asked')`,
			"the page shows it")
		require.Equal(t, 1, eval[int](t, b, `document.scripts.length`), "no script got in")
	})

	require.Empty(t, b.takeErrors(), "no console errors, exceptions or dialogs")
}

// screenshot writes the bucket map, with lag piling up on a few buckets, to
// path (KUMI_SCREENSHOT; docs/console.png is made this way).
func screenshot(t *testing.T, f *fixture, b *browser, path string) {
	f.appendEvents(t, "acct", 5, 1500)
	b.waitFor(t, `[...document.querySelectorAll('#map .cell .lag')].some(l => parseFloat(l.style.width) > 50)`,
		"lag shows on the map")
	ctx, cancel := context.WithTimeout(b.ctx, browserWait)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.Screenshot(chromedp.CSS("main")))
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot of the bucket map written to %s", path)
}
