package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

// hostile is a stream id and a subscription name that would run script if
// the console ever wrote it as markup.
const hostile = `<script>alert("pwned")</script>`

// fixture is one test's schema: migrated, with events, and a console on it.
type fixture struct {
	schema string
	store  *eventsource.Store
	events []eventsource.RecordedEvent
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOn(t, pgtest.Pool(t))
}

// newFixtureOn is newFixture on the server pool reaches.
func newFixtureOn(t *testing.T, pool *pgxpool.Pool) *fixture {
	t.Helper()
	ctx := context.Background()
	schema := pgtest.NewSchema(t)
	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	require.NoError(t, err)
	require.NoError(t, store.Migrate(ctx))
	require.NoError(t, leasestore.Migrate(ctx, store.Pool(), schema))
	f := &fixture{schema: schema, store: store}
	f.events = f.appendEvents(t, "acct", 4, 20)
	return f
}

// appendEvents appends n events round robin over streams of category and
// sequences them.
func (f *fixture) appendEvents(t testing.TB, category string, streams, n int) []eventsource.RecordedEvent {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		_, err := f.store.Append(ctx, fmt.Sprintf("%s-%d", category, i%streams), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(fmt.Sprintf(`{"i":%d}`, i))}})
		require.NoError(t, err)
	}
	_, err := f.store.Sequence(ctx)
	require.NoError(t, err)
	evs, err := f.store.ReadCategory(ctx, category, 0, 10_000)
	require.NoError(t, err)
	return evs
}

// hostileLetter appends an event to a stream with a hostile id and dead-
// letters it for sub with a hostile reason.
func (f *fixture) hostileLetter(t testing.TB, sub string) eventsource.DeadLetter {
	t.Helper()
	ctx := context.Background()
	_, err := f.store.Append(ctx, "acct-"+hostile, eventsource.Any,
		[]eventsource.EventData{{Type: "Hostile", Data: []byte(`{"html":"<img src=x onerror=alert(1)>"}`)}})
	require.NoError(t, err)
	_, err = f.store.Sequence(ctx)
	require.NoError(t, err)
	evs, err := f.store.ReadStream(ctx, "acct-"+hostile, 0, 1)
	require.NoError(t, err)
	d, err := f.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: sub, Bucket: 0, EventID: evs[0].ID,
		Reason: "handler: " + hostile, Attempts: 5})
	require.NoError(t, err)
	return d
}

// join makes worker a worker of sub's pool of n buckets; it claims nothing
// until it passes.
func (f *fixture) join(t testing.TB, sub, worker string, n int) *leasestore.Store {
	t.Helper()
	s, err := leasestore.New(f.store.Pool(), leasestore.Config{Schema: f.schema,
		Subscription: sub, Worker: worker, Buckets: n, LeaseOptions: leasestore.LeaseOptions{TTL: time.Minute, NoListen: true}})
	if err == nil {
		err = s.Start(context.Background())
	}
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Stop(context.Background()) })
	return s
}

// lease joins and runs one pass.
func (f *fixture) lease(t testing.TB, sub, worker string, n int) *leasestore.Store {
	t.Helper()
	s := f.join(t, sub, worker, n)
	_, err := s.Pass(context.Background())
	require.NoError(t, err)
	return s
}

// settle runs passes, handing over what is asked for, until no handoff is
// pending: the buckets are then split fairly.
func settle(t testing.TB, stores ...*leasestore.Store) {
	t.Helper()
	ctx := context.Background()
	pgtest.Eventually(t, 30*time.Second, func() bool {
		busy := false
		for _, s := range stores {
			res, err := s.Pass(ctx)
			require.NoError(t, err)
			for _, b := range res.HandOff {
				require.NoError(t, s.HandOver(ctx, b))
			}
			busy = busy || len(res.HandOff) > 0 || len(res.Pending) > 0
		}
		return !busy
	}, "the pool settles")
}

// serve starts a console on an httptest server.
func (f *fixture) serve(t testing.TB, opts Options) (*Console, *httptest.Server) {
	t.Helper()
	opts.Store = f.store
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	c, err := New(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return c, srv
}

type response struct {
	status int
	header http.Header
	body   string
}

func do(t testing.TB, req *http.Request) response {
	t.Helper()
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return response{resp.StatusCode, resp.Header, string(b)}
}

func get(t testing.TB, srv *httptest.Server, path string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	return do(t, req)
}

// post sends an action the way the page does: POST, same origin, with the
// console's CSRF token.
func post(t testing.TB, srv *httptest.Server, c *Console, path string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, srv.URL+path, nil)
	require.NoError(t, err)
	req.Header.Set(csrfHeader, c.csrf)
	req.Header.Set("Origin", srv.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	return do(t, req)
}

func decode[T any](t testing.TB, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), s)
	return v
}

func TestPagesAndJSONShowTheSubscription(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	settle(t, f.lease(t, "orders", "worker-a", 4), f.lease(t, "orders", "worker-b", 4))
	d := f.hostileLetter(t, "orders")
	_, srv := f.serve(t, Options{Categories: map[string]string{"orders": "acct"}})

	r := get(t, srv, "/")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, `href="./s/orders"`)
	csp := r.header.Get("Content-Security-Policy")
	require.Contains(t, csp, "script-src 'self'")
	require.NotContains(t, csp, "unsafe-inline")
	require.NotContains(t, r.body, "<script>", "no inline script: only <script src>")

	st := decode[subState](t, get(t, srv, "/api/s/orders").body)
	require.Equal(t, 4, st.Buckets)
	require.Equal(t, 2, st.LiveWorkers)
	require.Len(t, st.Rows, 4)
	require.Equal(t, 1, st.PendingLetters)
	require.False(t, st.Actions.Enabled)
	owners := map[string]int{}
	for _, b := range st.Rows {
		require.True(t, b.Live)
		require.NotNil(t, b.Lag, "lag is measured: the category is known")
		owners[b.Owner]++
	}
	require.Len(t, owners, 2, "both workers own buckets: %v", owners)
	var lag int64
	for _, b := range st.Rows {
		lag += *b.Lag
	}
	require.EqualValues(t, len(f.events)+1, lag, "every event of the category is lag: no checkpoint yet")

	r = get(t, srv, "/s/orders/letters")
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, "acct-&lt;script&gt;alert(&#34;pwned&#34;)&lt;/script&gt;")
	require.NotContains(t, r.body, hostile)

	r = get(t, srv, "/s/orders/letters/"+d.EventID.String())
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, "handler: &lt;script&gt;")
	require.Contains(t, r.body, "&lt;img src=x onerror=alert(1)&gt;", "the payload is shown, as text")
	require.NotContains(t, r.body, hostile)
	require.NotContains(t, r.body, "<img src=x")
	require.Contains(t, r.body, `id="discard" disabled`, "read-only: the buttons are disabled")

	// Dead-lettered again: the page shows the reason it had first, escaped.
	_, err := f.store.AddDeadLetter(context.Background(), eventsource.DeadLetter{Subscription: d.Subscription, EventID: d.EventID, Reason: "later", Attempts: 2})
	require.NoError(t, err)
	r = get(t, srv, "/s/orders/letters/"+d.EventID.String())
	require.Equal(t, http.StatusOK, r.status)
	require.Contains(t, r.body, "Earlier reasons")
	require.Contains(t, r.body, `<pre class="reason">handler: &lt;script&gt;`, "the first reason, as text")
	require.NotContains(t, r.body, hostile)

	r = get(t, srv, "/s/orders/letters/not-a-uuid")
	require.Equal(t, http.StatusBadRequest, r.status)
	r = get(t, srv, "/api/s/"+url.PathEscape(" padded"))
	require.Equal(t, http.StatusBadRequest, r.status)
	require.Contains(t, decode[map[string]string](t, r.body)["error"], "white space")

	for _, asset := range []string{"/assets/console.js", "/assets/console.css", "/assets/favicon.svg", "/favicon.ico"} {
		require.Equal(t, http.StatusOK, get(t, srv, asset).status, asset)
	}
}

func TestAHostileSubscriptionNameIsText(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.hostileLetter(t, hostile)
	_, srv := f.serve(t, Options{})
	for _, path := range []string{"/", "/s/" + url.PathEscape(hostile), "/s/" + url.PathEscape(hostile) + "/letters"} {
		r := get(t, srv, path)
		require.Equal(t, http.StatusOK, r.status, path)
		require.NotContains(t, r.body, hostile, path)
		require.Contains(t, r.body, "&lt;script&gt;alert(", path)
	}
	var subs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(get(t, srv, "/api/overview").body), &subs))
	require.Equal(t, hostile, subs[0]["subscription"], "JSON carries the name as a string; the page writes it as text")
}

func TestErrorsNeverShowAConnectionString(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	writeError(w, http.StatusInternalServerError, `dial postgres://kumi:s3cret@db:5432/kumi failed; password=hunter2 x`)
	require.NotContains(t, w.Body.String(), "s3cret")
	require.NotContains(t, w.Body.String(), "hunter2")
}

func TestTheTokenGuardsEveryRequest(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	const token = "0123456789abcdef-token"
	_, srv := f.serve(t, Options{Token: token})

	for _, path := range []string{"/", "/api/overview", "/assets/console.js", "/s/x/letters"} {
		r := get(t, srv, path)
		require.Equal(t, http.StatusUnauthorized, r.status, path)
		require.NotContains(t, r.body, token)
	}
	require.Equal(t, http.StatusUnauthorized, get(t, srv, "/?token=wrong-token-wrong-token").status)

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/overview", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	require.Equal(t, http.StatusOK, do(t, req).status)

	r := get(t, srv, "/s/x/letters?token="+token+"&all=1")
	require.Equal(t, http.StatusSeeOther, r.status)
	require.Equal(t, "letters?all=1", r.header.Get("Location"), "the token leaves the address, which stays relative")
	cookie := r.header.Get("Set-Cookie")
	require.Contains(t, cookie, "HttpOnly")
	require.Contains(t, cookie, "SameSite=Strict")

	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.AddCookie(&http.Cookie{Name: tokenCookie, Value: token})
	require.Equal(t, http.StatusOK, do(t, req).status)
}

func TestHostsRefuseOtherHostNames(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, srv := f.serve(t, Options{Hosts: []string{"localhost", "127.0.0.1", "::1"}})
	for host, want := range map[string]int{
		"":                    http.StatusOK, // the server's own, 127.0.0.1:port
		"localhost:7070":      http.StatusOK,
		"[::1]:7070":          http.StatusOK,
		"rebind.example":      http.StatusMisdirectedRequest,
		"rebind.example:7070": http.StatusMisdirectedRequest,
		"127.0.0.1.nip.io:80": http.StatusMisdirectedRequest,
	} {
		req, err := http.NewRequest(http.MethodGet, srv.URL+"/api/overview", nil)
		require.NoError(t, err)
		if host != "" {
			req.Host = host
		}
		require.Equal(t, want, do(t, req).status, host)
	}
	_, err := New(Options{Store: f.store, Hosts: []string{"localhost:80"}})
	var oe *kumierr.ConfigError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "console.Options.Hosts[0]", oe.Field)
}

func TestActionsAreRefusedUnlessEnabled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "orders", "worker-a", 2)
	f.join(t, "orders", "worker-b", 2)
	d := f.hostileLetter(t, "orders")
	var logs syncBuffer
	c, srv := f.serve(t, Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	for _, path := range []string{"/api/s/orders/buckets/0/relinquish", "/api/s/orders/letters/" + d.EventID.String() + "/discard"} {
		r := post(t, srv, c, path)
		require.Equal(t, http.StatusForbidden, r.status, path)
		require.Contains(t, r.body, "actions are disabled")
	}
	_, err := f.store.DeadLetter(context.Background(), "orders", d.EventID)
	require.NoError(t, err, "the letter is still there")
	in, err := inspect.Inspect(context.Background(), f.store, "orders", "")
	require.NoError(t, err)
	for _, row := range in.Rows {
		require.Empty(t, row.ClaimWorker, "no claim was placed")
	}
	require.Contains(t, logs.String(), "actions are disabled")
	require.NotContains(t, get(t, srv, "/s/orders").body, "data-csrf=\""+c.csrf, "no token in a read-only page")
}

func TestActionsNeedTheTokenAndTheSameOrigin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.hostileLetter(t, "orders")
	c, srv := f.serve(t, Options{AllowActions: true})
	path := srv.URL + "/api/s/orders/letters/" + d.EventID.String() + "/discard"

	page := get(t, srv, "/s/orders")
	require.Contains(t, page.body, `data-csrf="`+c.csrf+`"`)

	cases := map[string]func(r *http.Request){
		"NoToken":    func(r *http.Request) {},
		"WrongToken": func(r *http.Request) { r.Header.Set(csrfHeader, "nope") },
		"CrossSite": func(r *http.Request) {
			r.Header.Set(csrfHeader, c.csrf)
			r.Header.Set("Sec-Fetch-Site", "cross-site")
		},
		"OtherOrigin": func(r *http.Request) {
			r.Header.Set(csrfHeader, c.csrf)
			r.Header.Set("Origin", "https://evil.example")
		},
	}
	for name, mutate := range cases {
		req, _ := http.NewRequest(http.MethodPost, path, nil)
		mutate(req)
		r := do(t, req)
		require.Equal(t, http.StatusForbidden, r.status, name)
	}
	r := get(t, srv, "/api/s/orders/letters/"+d.EventID.String()+"/discard")
	require.NotEqual(t, http.StatusOK, r.status, "GET never acts")
	_, err := f.store.DeadLetter(context.Background(), "orders", d.EventID)
	require.NoError(t, err, "no refused request discarded the letter")

	r = post(t, srv, c, "/api/s/orders/letters/"+d.EventID.String()+"/discard")
	require.Equal(t, http.StatusOK, r.status, r.body)
}

func TestRelinquishPlacesAHandoffClaimWithTheCLIsRefusals(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "orders", "worker-a", 4) // alone: takes all four
	f.join(t, "orders", "worker-b", 4)  // a worker that has placed no claim yet
	var logs syncBuffer
	c, srv := f.serve(t, Options{AllowActions: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	r := post(t, srv, c, "/api/s/orders/buckets/1/relinquish")
	require.Equal(t, http.StatusOK, r.status, r.body)
	msg := decode[map[string]string](t, r.body)["message"]
	require.Contains(t, msg, "asked worker-a to hand bucket 1")
	require.Contains(t, msg, "over to worker-b")
	in, err := inspect.Inspect(context.Background(), f.store, "orders", "")
	require.NoError(t, err)
	require.Equal(t, "worker-b", in.Rows[1].ClaimWorker)
	require.Contains(t, logs.String(), "action=relinquish")
	require.Contains(t, logs.String(), "console action")

	refusals := map[string]struct {
		path   string
		status int
		want   string
	}{
		"PendingClaim":   {"/api/s/orders/buckets/1/relinquish", http.StatusConflict, "already has a pending claim"},
		"OutOfRange":     {"/api/s/orders/buckets/4/relinquish", http.StatusBadRequest, "buckets 0 to 3"},
		"Negative":       {"/api/s/orders/buckets/-1/relinquish", http.StatusBadRequest, "numbered from 0"},
		"NotANumber":     {"/api/s/orders/buckets/x/relinquish", http.StatusBadRequest, "numbered from 0"},
		"NoSuchSub":      {"/api/s/nosuch/buckets/0/relinquish", http.StatusNotFound, "no buckets"},
		"ToTheOwner":     {"/api/s/orders/buckets/2/relinquish?to=worker-a", http.StatusBadRequest, "is the bucket's owner"},
		"ToANonWorker":   {"/api/s/orders/buckets/2/relinquish?to=ghost", http.StatusBadRequest, "not a live worker"},
		"InvalidSubName": {"/api/s/" + url.PathEscape(" x") + "/buckets/0/relinquish", http.StatusBadRequest, "white space"},
	}
	for name, tc := range refusals {
		r := post(t, srv, c, tc.path)
		require.Equal(t, tc.status, r.status, "%s: %s", name, r.body)
		require.Contains(t, decode[map[string]string](t, r.body)["error"], tc.want, name)
	}
}

func TestReplayAndDiscardADeadLetter(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	letter := func(i int) eventsource.DeadLetter {
		d, err := f.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "orders", Bucket: 0,
			EventID: f.events[i].ID, Reason: "boom", Attempts: 3})
		require.NoError(t, err)
		return d
	}
	ok, failing := letter(0), letter(1)
	var replayed []string
	fail := errors.New("the handler still fails")
	c, srv := f.serve(t, Options{AllowActions: true, Replay: func(_ context.Context, sub string, ev eventsource.RecordedEvent) error {
		if ev.ID == failing.EventID {
			return fail
		}
		replayed = append(replayed, sub+"/"+ev.ID.String())
		return nil
	}})
	base := "/api/s/orders/letters/"

	r := post(t, srv, c, base+ok.EventID.String()+"/replay")
	require.Equal(t, http.StatusOK, r.status, r.body)
	require.Equal(t, []string{"orders/" + ok.EventID.String()}, replayed)
	d, err := f.store.DeadLetter(ctx, "orders", ok.EventID)
	require.NoError(t, err)
	require.NotNil(t, d.ReplayedAt, "marked replayed")
	r = post(t, srv, c, base+ok.EventID.String()+"/replay")
	require.Equal(t, http.StatusConflict, r.status, "already replayed: %s", r.body)

	r = post(t, srv, c, base+failing.EventID.String()+"/replay")
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Contains(t, r.body, "the handler still fails")
	require.Contains(t, r.body, "stays pending")
	d, err = f.store.DeadLetter(ctx, "orders", failing.EventID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt)
	require.Equal(t, 4, d.Attempts, "the failed replay counted")

	r = post(t, srv, c, base+failing.EventID.String()+"/discard")
	require.Equal(t, http.StatusOK, r.status, r.body)
	_, err = f.store.DeadLetter(ctx, "orders", failing.EventID)
	require.ErrorIs(t, err, eventsource.ErrDeadLetterNotFound)
	r = post(t, srv, c, base+failing.EventID.String()+"/discard")
	require.Equal(t, http.StatusNotFound, r.status)
	r = post(t, srv, c, base+"nope/discard")
	require.Equal(t, http.StatusBadRequest, r.status)

	c2, srv2 := f.serve(t, Options{AllowActions: true})
	r = post(t, srv2, c2, base+ok.EventID.String()+"/replay")
	require.Equal(t, http.StatusForbidden, r.status)
	require.Contains(t, r.body, "no replay handler")
	require.Contains(t, get(t, srv2, "/s/orders/letters/"+ok.EventID.String()).body, `id="replay" disabled`)
}

func TestOptionsAreValidatedNamingTheField(t *testing.T) {
	t.Parallel()
	store, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: "unused"})
	require.NoError(t, err)
	cases := map[string]Options{
		"Store":                 {},
		"Token":                 {Store: store, Token: "short"},
		`Categories["orders"]`:  {Store: store, Categories: map[string]string{"orders": "a-b"}},
		`Categories[" orders"]`: {Store: store, Categories: map[string]string{" orders": "acct"}},
	}
	for field, opts := range cases {
		_, err := New(opts)
		var oe *kumierr.ConfigError
		require.ErrorAs(t, err, &oe, field)
		require.Equal(t, "console.Options."+field, oe.Field)
	}
	_, err = New(Options{Store: store, Token: "with a space in it!"})
	require.ErrorContains(t, err, "white space")
}

// syncBuffer is a bytes.Buffer safe for the console's concurrent logging.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestResetCheckpointWithTheCLIsSafetyRules(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	a := f.lease(t, "orders", "worker-a", 4) // alone: holds all four
	require.NoError(t, a.Release(ctx, []int{3}))
	held := a.Held()[0]
	_, err := f.store.SaveCheckpoint(ctx, "orders", held.Bucket, 10, a.Fence(held.Bucket, held.Epoch))
	require.NoError(t, err)
	head, err := f.store.HeadPosition(ctx)
	require.NoError(t, err)
	checkpoint := func(bucket int) int64 {
		p, err := f.store.Checkpoint(ctx, "orders", bucket)
		require.NoError(t, err)
		return p
	}
	reset := fmt.Sprintf("/api/s/orders/buckets/%d/reset?position=3", held.Bucket)

	t.Run("OffUnlessActionsAreEnabled", func(t *testing.T) {
		c, srv := f.serve(t, Options{})
		r := post(t, srv, c, reset+"&force=1")
		require.Equal(t, http.StatusForbidden, r.status)
		require.Contains(t, r.body, "actions are disabled")
		require.EqualValues(t, 10, checkpoint(held.Bucket))
	})

	var logs syncBuffer
	c, srv := f.serve(t, Options{AllowActions: true, Logger: slog.New(slog.NewTextHandler(&logs, nil))})

	t.Run("OnlyWithTheTokenFromTheSameOrigin", func(t *testing.T) {
		for name, mutate := range map[string]func(r *http.Request){
			"NoToken":   func(r *http.Request) {},
			"CrossSite": func(r *http.Request) { r.Header.Set(csrfHeader, c.csrf); r.Header.Set("Sec-Fetch-Site", "cross-site") },
		} {
			req, _ := http.NewRequest(http.MethodPost, srv.URL+reset+"&force=1", nil)
			mutate(req)
			require.Equal(t, http.StatusForbidden, do(t, req).status, name)
		}
		require.NotEqual(t, http.StatusOK, get(t, srv, reset+"&force=1").status, "GET never acts")
		require.EqualValues(t, 10, checkpoint(held.Bucket))
	})

	t.Run("Refusals", func(t *testing.T) {
		for name, tc := range map[string]struct {
			path   string
			status int
			want   string
		}{
			"LiveOwner":      {reset, http.StatusConflict, "is held by worker-a"},
			"PastTheHead":    {fmt.Sprintf("/api/s/orders/buckets/3/reset?position=%d", head+1), http.StatusBadRequest, "past the store's head"},
			"Unknown":        {"/api/s/nosuch/buckets/0/reset?position=0", http.StatusNotFound, `"nosuch" is unknown`},
			"OutOfRange":     {"/api/s/orders/buckets/4/reset?position=0", http.StatusBadRequest, "buckets 0 to 3"},
			"Negative":       {"/api/s/orders/buckets/-1/reset?position=0", http.StatusBadRequest, "numbered from 0"},
			"NoPosition":     {"/api/s/orders/buckets/3/reset", http.StatusBadRequest, "an integer >= 0"},
			"BadPosition":    {"/api/s/orders/buckets/3/reset?position=-4", http.StatusBadRequest, "an integer >= 0"},
			"BadFlag":        {"/api/s/orders/buckets/3/reset?position=0&force=maybe", http.StatusBadRequest, `force="maybe"`},
			"InvalidSubName": {"/api/s/" + url.PathEscape(" x") + "/buckets/0/reset?position=0", http.StatusBadRequest, "white space"},
		} {
			r := post(t, srv, c, tc.path)
			require.Equal(t, tc.status, r.status, "%s: %s", name, r.body)
			require.Contains(t, decode[map[string]string](t, r.body)["error"], tc.want, name)
		}
		require.EqualValues(t, 10, checkpoint(held.Bucket), "nothing refused was written")
		in, err := inspect.Inspect(ctx, f.store, "orders", "")
		require.NoError(t, err)
		require.Equal(t, held.Epoch, in.Rows[held.Bucket].Epoch, "nor fenced")
	})

	t.Run("ForcedFencesTheLiveOwnerOut", func(t *testing.T) {
		r := post(t, srv, c, reset+"&force=1")
		require.Equal(t, http.StatusOK, r.status, r.body)
		msg := decode[map[string]string](t, r.body)["message"]
		require.Contains(t, msg, fmt.Sprintf("bucket %d: checkpoint 10 -> 3", held.Bucket))
		require.Contains(t, msg, fmt.Sprintf("worker-a was fenced out (epoch %d -> %d)", held.Epoch, held.Epoch+1))
		require.EqualValues(t, 3, checkpoint(held.Bucket))
		_, err := f.store.SaveCheckpoint(ctx, "orders", held.Bucket, 12, a.Fence(held.Bucket, held.Epoch))
		require.ErrorIs(t, err, eventsource.ErrFenceLost, "the owner's in-memory position cannot undo the reset")
		require.EqualValues(t, 3, checkpoint(held.Bucket))
		require.Contains(t, logs.String(), "action=reset")
		require.Contains(t, logs.String(), "console action")
	})

	t.Run("AFreeBucketNeedsNoForceAndBeyondTheHeadWhenAllowed", func(t *testing.T) {
		r := post(t, srv, c, fmt.Sprintf("/api/s/orders/buckets/3/reset?position=%d&beyond_head=1", head+5))
		require.Equal(t, http.StatusOK, r.status, r.body)
		require.Contains(t, decode[map[string]string](t, r.body)["message"], fmt.Sprintf("checkpoint 0 -> %d", head+5))
		require.EqualValues(t, head+5, checkpoint(3))
	})
}

// The console showed an empty page, with 200, for a subscription the
// schema does not know (issue 15): it answers 404, as the CLI refuses it.
func TestUnknownSubscriptionsAreRefusedWithA404(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "orders", "worker-a", 2)
	_, srv := f.serve(t, Options{Categories: map[string]string{"planned": "acct"}})
	for _, path := range []string{"/s/nosuch", "/s/nosuch/letters", "/s/" + url.PathEscape(hostile)} {
		r := get(t, srv, path)
		require.Equal(t, http.StatusNotFound, r.status, path)
		require.Contains(t, r.body, "<h1>Not found</h1>", path)
		require.Contains(t, r.body, "is unknown in schema", path)
		require.NotContains(t, r.body, hostile, path)
	}
	r := get(t, srv, "/api/s/nosuch")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Contains(t, decode[map[string]string](t, r.body)["error"], `subscription "nosuch" is unknown`)

	require.Equal(t, http.StatusOK, get(t, srv, "/s/orders").status)
	r = get(t, srv, "/s/planned")
	require.Equal(t, http.StatusOK, r.status, "a subscription named in Options.Categories has a page before it starts")
	st := decode[subState](t, get(t, srv, "/api/s/planned").body)
	require.Zero(t, st.Buckets)
}

// Every viewer of a subscription polled /api/s/{sub} every second, and
// each poll read the tables: several viewers of one subscription share one
// read a second (issue 15).
func TestViewersOfOneSubscriptionShareOneReadASecond(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "orders", "worker-a", 4)
	f.lease(t, "refunds", "worker-a", 2)
	c, srv := f.serve(t, Options{})
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c.looks.now = func() time.Time { return time.Unix(0, clock.Load()) }
	reads := map[string]int{}
	var mu sync.Mutex
	read := c.looks.read
	c.looks.read = func(ctx context.Context, sub string) (subState, error) {
		mu.Lock()
		reads[sub]++
		mu.Unlock()
		return read(ctx, sub)
	}
	viewers := func(sub string, n int) []subState {
		out := make([]subState, n)
		var wg sync.WaitGroup
		for i := range out {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/s/"+sub, nil)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					defer resp.Body.Close()
					err = json.NewDecoder(resp.Body).Decode(&out[i])
				}
				assert.NoError(t, err)
			}()
		}
		wg.Wait()
		return out
	}
	count := func(sub string) int {
		mu.Lock()
		defer mu.Unlock()
		return reads[sub]
	}

	first := viewers("orders", 8)
	require.Equal(t, 1, count("orders"), "eight viewers at once, one read")
	for _, st := range first {
		require.Equal(t, first[0].Now, st.Now, "each got the same look")
		require.Equal(t, 4, st.Buckets)
	}
	clock.Add(int64(lookEvery / 2))
	viewers("orders", 8)
	require.Equal(t, 1, count("orders"), "half a second later: still the same look")
	clock.Add(int64(lookEvery / 2))
	again := viewers("orders", 8)
	require.Equal(t, 2, count("orders"), "a second later: one more read")
	require.True(t, again[0].Now.After(first[0].Now))
	viewers("refunds", 3)
	require.Equal(t, 1, count("refunds"), "another subscription has its own look")
	require.Equal(t, 2, count("orders"))
}

// TestCountsAreReadOnTheReadStore: with Options.Reads on a hot standby
// whose replay is paused, the heavy reads are the standby's — the buckets'
// lag, the pending dead letters of a subscription's page, the overview's
// checkpoint and dead letter counts (page and JSON) — while the leases and
// the head come from Store, the primary.
func TestCountsAreReadOnTheReadStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := pgtest.LocalServer(t)
	f := newFixtureOn(t, pgtest.PoolOn(t, srv.URL, 4))
	settle(t, f.lease(t, "orders", "worker-a", 2))
	r := pgtest.NewReplica(t, srv)
	require.NoError(t, r.WaitReplayed(ctx))
	require.NoError(t, r.PauseReplay(ctx))
	t.Cleanup(func() { _ = r.ResumeReplay(context.Background()) })
	f.appendEvents(t, "acct", 4, 6)
	f.hostileLetter(t, "orders") // one more event, and a pending dead letter, on the primary only
	reads, err := eventsource.New(pgtest.PoolOn(t, r.URL, 4), eventsource.Config{Schema: f.schema})
	require.NoError(t, err)
	_, hs := f.serve(t, Options{Reads: reads, Categories: map[string]string{"orders": "acct"}})

	st := decode[subState](t, get(t, hs, "/api/s/orders").body)
	require.EqualValues(t, 27, st.Head, "the head is the primary's")
	var lag int64
	for _, b := range st.Rows {
		lag += *b.Lag
	}
	require.EqualValues(t, 20, lag, "the lag is the paused standby's count")
	assert.Zero(t, st.PendingLetters, "the pending dead letters are the paused standby's count")

	subs := decode[[]inspect.SubscriptionSummary](t, get(t, hs, "/api/overview").body)
	require.Len(t, subs, 1)
	require.Equal(t, 2, subs[0].Held, "the leases are the primary's")
	assert.Zero(t, subs[0].DeadLetters, "the overview's dead letters are the paused standby's count")
	page := get(t, hs, "/")
	require.Equal(t, http.StatusOK, page.status)
	assert.NotContains(t, page.body, "s/orders/letters", "the overview page links dead letters the paused standby does not have")
}
