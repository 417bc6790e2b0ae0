package console

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// statusLog records the status of every request a handler answered.
type statusLog struct {
	mu   sync.Mutex
	seen []string // "METHOD PATH STATUS"
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
	w.ResponseWriter.WriteHeader(s)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

func (l *statusLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		l.mu.Lock()
		l.seen = append(l.seen, fmt.Sprintf("%s %s %d", r.Method, r.URL.Path, sw.status))
		l.mu.Unlock()
	})
}

func (l *statusLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.seen...)
}

// attackPage is another site's page that tries, once loaded, every way a
// page has to act on a console at base: requests without a body (no-cors,
// so the browser sends them), one with the CSRF header (which needs a
// preflight), a form posted into a frame, a read of the page that holds
// the CSRF token, and the page itself in a frame.
const attackPage = `<!doctype html><title>another site</title>
<form method="post" target="sink" action="%[1]s/api/s/orders/buckets/0/reset?force=1&amp;position=HEAD"></form>
<iframe name="sink"></iframe><iframe id="framed" src="%[1]s/s/orders"></iframe>
<script>
window.results = [];
(async () => {
  const base = %[1]q, paths = ["/api/s/orders/letters/%[2]s/discard", "/api/s/orders/buckets/0/reset?force=1&position=HEAD",
    "/api/s/orders/buckets/0/relinquish"];
  for (const p of paths) {
    try { await fetch(base + p, {method: "POST", mode: "no-cors", credentials: "include"}); results.push("sent " + p); }
    catch (e) { results.push("failed " + p); }
    try { await fetch(base + p, {method: "POST", headers: {"X-Kumi-Csrf": "guess"}}); results.push("read " + p); }
    catch (e) { results.push("preflight refused " + p); }
  }
  try { const r = await fetch(base + "/s/orders"); results.push("read page " + (await r.text()).includes("data-csrf")); }
  catch (e) { results.push("page unreadable"); }
  try { await fetch(base + "/api/s/orders", {mode: "no-cors"}); results.push("sent read"); } catch (e) { results.push("failed read"); }
  document.forms[0].submit();
  window.done = true;
})();
</script>`

// TestACrossOriginPageCannotChangeAnything: in a real browser, a page of
// another site (localhost:PORT, while the console is 127.0.0.1:PORT) tries
// to discard a dead letter, reset a checkpoint and relinquish a bucket of
// a console with actions on, and to read its CSRF token; and a page on a
// name that resolves to the console's address (DNS rebinding, simulated by
// Chromium's host resolver rules) is not served. Nothing changes, and the
// console answered every request that reached it with a refusal.
func TestACrossOriginPageCannotChangeAnything(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	d := f.hostileLetter(t, "orders")
	a := f.lease(t, "orders", "worker-a", 1)
	_, err := f.store.SaveCheckpoint(ctx, "orders", 0, 2, a.Fence(0, a.Held()[0].Epoch))
	require.NoError(t, err)

	c, err := New(Options{Store: f.store, AllowActions: true, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	var log statusLog
	srv := httptest.NewServer(log.wrap(c))
	t.Cleanup(srv.Close)
	attacker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, attackPage, srv.URL, d.EventID)
	}))
	t.Cleanup(attacker.Close)
	b := newBrowser(t)

	b.run(t, chromedp.Navigate(strings.Replace(attacker.URL, "127.0.0.1", "localhost", 1)+"/"))
	b.waitFor(t, `window.done === true`, "the other site's page tried everything")
	results := eval[[]string](t, b, `window.results`)
	require.NotContains(t, results, "read page true", "the other site never reads the CSRF token")
	for _, r := range results {
		require.False(t, strings.HasPrefix(r, "read "), "a cross-origin read succeeded: %v", results)
	}
	b.waitFor(t, `(() => { try { return frames.sink.location.href !== 'about:blank' } catch (e) { return true } })()`,
		"the form was posted")

	// The rebinding page: its name resolves to the console's address.
	rebound := strings.Replace(srv.URL, "127.0.0.1", "rebind.test", 1)
	b.run(t, chromedp.Navigate(rebound+"/s/orders"))
	body := eval[string](t, b, `document.documentElement.outerHTML`)
	require.Contains(t, body, "does not answer to host")
	require.NotContains(t, body, "data-csrf")
	require.EqualValues(t, 421, eval[float64](t, b, `fetch('/api/s/orders').then(r => r.status)`))
	require.EqualValues(t, 421, eval[float64](t, b, `fetch('/api/s/orders/letters/`+d.EventID.String()+
		`/discard', {method: 'POST', headers: {'X-Kumi-Csrf': 'guess'}}).then(r => r.status)`))

	_, err = f.store.DeadLetter(ctx, "orders", d.EventID)
	require.NoError(t, err, "the dead letter is still there")
	p, err := f.store.Checkpoint(ctx, "orders", 0)
	require.NoError(t, err)
	require.EqualValues(t, 2, p, "the checkpoint did not move")
	res, err := a.Pass(ctx)
	require.NoError(t, err)
	require.Empty(t, res.HandOff, "no handoff was asked of worker-a")

	seen := log.all()
	acted := 0
	for _, s := range seen {
		if strings.HasPrefix(s, "POST ") {
			acted++
			require.Regexp(t, ` (403|421)$`, s, "every action that reached the console was refused: %v", seen)
		}
		if strings.HasPrefix(s, "GET /s/orders ") || strings.HasPrefix(s, "GET /api/s/orders ") {
			require.Regexp(t, ` (403|421)$`, s, "every cross-site read was refused: %v", seen)
		}
	}
	require.GreaterOrEqual(t, acted, 4, "the no-cors posts and the form reached the console: %v", seen)
	t.Logf("the console saw: %v; the page got: %v", seen, results)
}
