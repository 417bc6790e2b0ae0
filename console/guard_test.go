package console

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/kumierr"
)

// servedOn serves a console as a server listening on local (an address
// beyond loopback, as "0.0.0.0:7070" gives a client on another machine)
// does: the request's context says where it arrived, as http.Server's
// does through http.LocalAddrContextKey.
func (f *fixture) servedOn(t *testing.T, local string, opts Options) (*Console, *httptest.Server) {
	t.Helper()
	opts.Store = f.store
	opts.Logger = slog.New(slog.DiscardHandler)
	c, err := New(opts)
	require.NoError(t, err)
	addr, err := net.ResolveTCPAddr("tcp", local)
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), http.LocalAddrContextKey, addr)))
	}))
	t.Cleanup(srv.Close)
	return c, srv
}

// getAs is a GET with the Host header a client would send to host.
func getAs(t *testing.T, srv *httptest.Server, host, path string, hdr ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	req.Host = host
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return do(t, req)
}

var csrfAttr = regexp.MustCompile(`data-csrf="([0-9a-f]+)"`)

// The hole: `kumi console --listen 0.0.0.0:PORT --allow-actions` without
// a token let a client on another machine copy the page's CSRF token and
// reset a checkpoint, fencing out its live owner.
func TestAConsoleWithoutATokenAnswersBeyondLoopbackOnlyReadOnlyAndWhenTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newFixture(t)
	a := f.lease(t, "orders", "worker-a", 1)
	held := a.Held()[0]
	_, err := f.store.SaveCheckpoint(ctx, "orders", 0, 3, a.Fence(0, held.Epoch))
	require.NoError(t, err)
	const public = "10.1.2.3:7070"

	t.Run("WithActionsNothingIsServed", func(t *testing.T) {
		_, srv := f.servedOn(t, public, Options{AllowActions: true, AllowReadsWithoutToken: true})
		page := getAs(t, srv, public, "/s/orders")
		require.Equal(t, http.StatusForbidden, page.status)
		require.NotRegexp(t, csrfAttr, page.body)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/s/orders/buckets/0/reset?force=1&position=HEAD", nil)
		req.Host = public
		require.Equal(t, http.StatusForbidden, do(t, req).status)
		p, err := f.store.Checkpoint(ctx, "orders", 0)
		require.NoError(t, err)
		require.EqualValues(t, 3, p, "the checkpoint did not move")
	})
	t.Run("ReadOnlyOnlyWhenTold", func(t *testing.T) {
		_, srv := f.servedOn(t, public, Options{})
		require.Equal(t, http.StatusForbidden, getAs(t, srv, public, "/api/overview").status)
		_, srv = f.servedOn(t, public, Options{AllowReadsWithoutToken: true})
		require.Equal(t, http.StatusOK, getAs(t, srv, public, "/api/overview").status)
	})
	t.Run("WithATokenActionsNeedIt", func(t *testing.T) {
		const token = "0123456789abcdef-token"
		_, srv := f.servedOn(t, public, Options{AllowActions: true, Token: token})
		require.Equal(t, http.StatusUnauthorized, getAs(t, srv, public, "/s/orders").status)
		require.Equal(t, http.StatusOK, getAs(t, srv, public, "/s/orders", "Authorization", "Bearer "+token).status)
	})
	t.Run("CheckListenRefusesToStart", func(t *testing.T) {
		for _, c := range []struct {
			addr string
			opts Options
			ok   bool
		}{
			{"0.0.0.0:7070", Options{AllowActions: true}, false},
			{"0.0.0.0:7070", Options{AllowActions: true, AllowReadsWithoutToken: true}, false},
			{"[::]:7070", Options{}, false},
			{":7070", Options{}, false},
			{"0.0.0.0:7070", Options{AllowReadsWithoutToken: true}, true},
			{"0.0.0.0:7070", Options{AllowActions: true, Token: "0123456789abcdef"}, true},
			{"127.0.0.1:7070", Options{AllowActions: true}, true},
			{"localhost:0", Options{AllowActions: true}, true},
			{"[::1]:7070", Options{AllowActions: true}, true},
		} {
			err := CheckListen(c.addr, c.opts)
			if c.ok {
				require.NoError(t, err, c.addr)
				continue
			}
			var oe *kumierr.ConfigError
			require.ErrorAs(t, err, &oe, c.addr)
			require.Equal(t, "console.Options.Token", oe.Field)
		}
	})
}

// The hole: a console mounted in a service answered any Host, so a page
// on a name that resolves to 127.0.0.1 (DNS rebinding) was same-origin
// with it and read its dead letters.
func TestAMountedConsoleAnswersOnlyItsOwnAddressByDefault(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.hostileLetter(t, "orders")
	_, srv := f.serve(t, Options{AllowActions: true}) // on 127.0.0.1, no Hosts
	for host, want := range map[string]int{
		srv.Listener.Addr().String(): http.StatusOK,
		"localhost:7070":             http.StatusOK,
		"[::1]:7070":                 http.StatusOK,
		"rebind.example:7070":        http.StatusMisdirectedRequest,
		"127.0.0.1.nip.io":           http.StatusMisdirectedRequest,
		"10.1.2.3:7070":              http.StatusMisdirectedRequest,
	} {
		r := getAs(t, srv, host, "/s/orders/letters")
		require.Equal(t, want, r.status, host)
		if want != http.StatusOK {
			require.NotContains(t, r.body, "Hostile", host)
			require.NotRegexp(t, csrfAttr, r.body, host)
		}
	}

	const token = "0123456789abcdef-token"
	_, srv = f.servedOn(t, "10.1.2.3:7070", Options{Token: token})
	auth := []string{"Authorization", "Bearer " + token}
	require.Equal(t, http.StatusOK, getAs(t, srv, "10.1.2.3:7070", "/api/overview", auth...).status)
	require.Equal(t, http.StatusMisdirectedRequest, getAs(t, srv, "ops.example", "/api/overview", auth...).status)
	require.Equal(t, http.StatusMisdirectedRequest, getAs(t, srv, "localhost", "/api/overview", auth...).status)

	_, srv = f.servedOn(t, "10.1.2.3:7070", Options{Token: token, Hosts: []string{"ops.example"}})
	require.Equal(t, http.StatusOK, getAs(t, srv, "ops.example:443", "/api/overview", auth...).status)
	require.Equal(t, http.StatusMisdirectedRequest, getAs(t, srv, "10.1.2.3", "/api/overview", auth...).status)
	_, srv = f.servedOn(t, "10.1.2.3:7070", Options{Token: token, Hosts: []string{AnyHost}})
	require.Equal(t, http.StatusOK, getAs(t, srv, "any.example", "/api/overview", auth...).status)

	// A server that does not say where a request arrived: no Host is its.
	c, err := New(Options{Store: f.store, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	w := httptest.NewRecorder()
	c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "http://localhost/api/overview", nil))
	require.Equal(t, http.StatusMisdirectedRequest, w.Code)
}

// The hole: any page the operator had open could fire fetch(…, {mode:
// "no-cors"}) at the console, and its GETs were served.
func TestGETsFromAnotherSiteAreRefused(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "orders", "worker-a", 2)
	_, srv := f.serve(t, Options{})
	host := srv.Listener.Addr().String()
	for _, c := range []struct {
		site, mode, dest string
		want             int
	}{
		{"cross-site", "no-cors", "empty", http.StatusForbidden},
		{"cross-site", "cors", "empty", http.StatusForbidden},
		{"same-site", "no-cors", "image", http.StatusForbidden},
		{"cross-site", "navigate", "iframe", http.StatusForbidden},
		{"cross-site", "navigate", "document", http.StatusOK}, // a link followed from elsewhere
		{"same-origin", "cors", "empty", http.StatusOK},
		{"none", "navigate", "document", http.StatusOK},
		{"", "", "", http.StatusOK}, // curl
	} {
		for _, path := range []string{"/", "/api/overview", "/api/s/orders", "/s/orders/letters", "/assets/console.js"} {
			r := getAs(t, srv, host, path, "Sec-Fetch-Site", c.site, "Sec-Fetch-Mode", c.mode, "Sec-Fetch-Dest", c.dest)
			require.Equal(t, c.want, r.status, "%s %+v", path, c)
		}
	}
}

// The hole: the overview ran its counts for every request, so a flood of
// requests was a flood of statements on the store.
func TestTheOverviewsViewersShareOneReadASecond(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.lease(t, "orders", "worker-a", 2)
	c, srv := f.serve(t, Options{})
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	c.summary.now = func() time.Time { return time.Unix(0, clock.Load()) }
	var reads atomic.Int32
	read := c.summary.read
	c.summary.read = func(ctx context.Context, key string) ([]inspect.SubscriptionSummary, error) {
		reads.Add(1)
		return read(ctx, key)
	}
	flood := func() {
		var wg sync.WaitGroup
		for i := range 40 {
			wg.Go(func() {
				path := []string{"/", "/api/overview"}[i%2]
				resp, err := http.Get(srv.URL + path)
				if assert.NoError(t, err) {
					assert.Equal(t, http.StatusOK, resp.StatusCode)
					_ = resp.Body.Close()
				}
			})
		}
		wg.Wait()
	}
	flood()
	require.EqualValues(t, 1, reads.Load(), "forty requests at once, one read")
	clock.Add(int64(lookEvery))
	flood()
	require.EqualValues(t, 2, reads.Load(), "a second later, one more")
}

// The dead letter pages read for each request: one client gets a burst of
// readBurst, then readsPerSecond.
func TestDeadLetterPagesAreLimitedPerClient(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.hostileLetter(t, "orders")
	c, srv := f.serve(t, Options{})
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	c.limit.now = func() time.Time { return now }
	served := func(n int) (ok int) {
		for i := range n {
			path := []string{"/s/orders/letters", "/s/orders/letters/" + d.EventID.String()}[i%2]
			switch r := get(t, srv, path); r.status {
			case http.StatusOK:
				ok++
			case http.StatusTooManyRequests:
				require.Equal(t, "1", r.header.Get("Retry-After"))
			default:
				t.Fatalf("%s: %d %s", path, r.status, r.body)
			}
		}
		return ok
	}
	require.Equal(t, readBurst, served(readBurst+10))
	now = now.Add(time.Second)
	require.Equal(t, readsPerSecond, served(readBurst))
	require.Equal(t, http.StatusOK, get(t, srv, "/api/s/orders").status, "the shared reads are not limited")
}

func TestAssetsListNoDirectory(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, srv := f.serve(t, Options{})
	require.Equal(t, http.StatusNotFound, get(t, srv, "/assets/").status)
	require.Equal(t, http.StatusOK, get(t, srv, "/assets/console.css").status)
}
