package console

import (
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kumi-run/kumi/internal/httpguard"
	"github.com/kumi-run/kumi/kumierr"
)

// The checks every request passes before the console reads anything:
//
//   - Host: the configured [Options.Hosts], or else the address the
//     request arrived on, and only loopback names when that is loopback.
//     A page whose own name resolves to the console's address (DNS
//     rebinding) is same-origin with it, and only the Host header tells.
//   - a token beyond loopback: a console without [Options.Token] answers
//     on a loopback address only, unless it is read-only and
//     [Options.AllowReadsWithoutToken] says so.
//   - Fetch Metadata: a browser's request from another site (a fetch, an
//     image, a frame) is refused; a link followed from elsewhere (a
//     top-level navigation) shows the page to the user, not to the site.
//   - reads the console does not share between viewers (the dead letter
//     pages) are limited per client.

// AnyHost in [Options.Hosts] turns the Host check off: for a console
// behind a reverse proxy that checks the Host itself.
const AnyHost = httpguard.AnyHost

// needsToken reports a request that this console, having no token, must
// not answer: it arrived on an address beyond loopback (or one the server
// does not tell), and the console has actions, or was not told that reads
// without a token are fine.
func (c *Console) needsToken(r *http.Request) bool {
	if c.opts.Token != "" || !c.opts.AllowActions && c.opts.AllowReadsWithoutToken {
		return false
	}
	return !httpguard.OnLoopback(r)
}

// crossSite reports a browser's request sent by another site's page, from
// its Fetch Metadata: Sec-Fetch-Site other than same-origin or none (the
// user typed the address), except a top-level navigation by GET.
// Clients that send no Fetch Metadata (curl, older browsers) are not
// refused here; the Host check, SameSite cookies and, for actions, the
// CSRF token still hold for them.
func crossSite(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
		return false
	}
	return r.Method != http.MethodGet || r.Header.Get("Sec-Fetch-Mode") != "navigate" ||
		r.Header.Get("Sec-Fetch-Dest") != "document"
}

// guard answers the requests the checks refuse, and reports whether it
// did.
func (c *Console) guard(w http.ResponseWriter, r *http.Request) bool {
	switch {
	case !httpguard.HostAllowed(r, c.opts.Hosts):
		c.log.Warn("console request refused: unexpected Host", "host", r.Host, "remote", r.RemoteAddr)
		http.Error(w, "this console does not answer to host "+strconv.Quote(r.Host)+
			" (Options.Hosts, or kumi console --host, names the hosts it answers to)", http.StatusMisdirectedRequest)
	case c.needsToken(r):
		c.log.Warn("console request refused: no token, and not on loopback", "remote", r.RemoteAddr)
		http.Error(w, "this console has no token: it answers on loopback only "+
			"(set Options.Token; a read-only console may set Options.AllowReadsWithoutToken)", http.StatusForbidden)
	case crossSite(r):
		c.log.Warn("console request refused: sent by another site", "path", r.URL.Path,
			"site", r.Header.Get("Sec-Fetch-Site"), "remote", r.RemoteAddr)
		http.Error(w, "cross-site request refused", http.StatusForbidden)
	default:
		return false
	}
	return true
}

// CheckListen refuses to serve a console with opts on addr (HOST:PORT)
// beyond loopback without a token: always with actions, and without them
// unless opts.AllowReadsWithoutToken. Its error is a *[kumierr.ConfigError]
// naming console.Options.Token. A server that listens should call it before it starts; the
// console refuses such requests (403) anyway.
func CheckListen(addr string, opts Options) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return &kumierr.ConfigError{Field: "console addr", Value: addr, Reason: "must be HOST:PORT"}
	}
	if opts.Token != "" || httpguard.IsLoopbackName(host) {
		return nil
	}
	if opts.AllowActions {
		return &kumierr.ConfigError{Field: "console.Options.Token", Reason: fmt.Sprintf("is empty, serving on %s with actions: anyone who reaches it could reset "+
			"checkpoints and discard dead letters; set a token or serve on loopback", addr)}
	}
	if !opts.AllowReadsWithoutToken {
		return &kumierr.ConfigError{Field: "console.Options.Token", Reason: fmt.Sprintf("is empty, serving on %s: anyone who reaches it reads every subscription's "+
			"state and dead letters, event data included; set a token, serve on loopback, "+
			"or say it is meant (AllowReadsWithoutToken)", addr)}
	}
	return nil
}

// readLimit bounds the reads one client gets that the console does not
// share (a dead letter page runs its statements for each request): a
// burst of readBurst, then readsPerSecond.
const (
	readBurst      = 20
	readsPerSecond = 5
)

// limiter is a token bucket per client address.
type limiter struct {
	now func() time.Time

	mu      sync.Mutex
	clients map[string]*bucket
}

type bucket struct {
	tokens float64
	at     time.Time
}

func newLimiter() *limiter { return &limiter{now: time.Now, clients: map[string]*bucket{}} }

// allow takes one read from client's bucket, and reports whether there
// was one.
func (l *limiter) allow(client string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b, ok := l.clients[client]
	if !ok {
		if len(l.clients) > 10000 { // forget full buckets, which a new one equals
			for k, o := range l.clients {
				if o.refill(now) >= readBurst {
					delete(l.clients, k)
				}
			}
		}
		b = &bucket{tokens: readBurst, at: now}
		l.clients[client] = b
	}
	b.tokens = b.refill(now)
	b.at = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func (b *bucket) refill(now time.Time) float64 {
	return min(readBurst, b.tokens+now.Sub(b.at).Seconds()*readsPerSecond)
}

// limited wraps a handler of unshared reads in the per-client limit.
func (c *Console) limited(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		client, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			client = r.RemoteAddr
		}
		if !c.limit.allow(client) {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "too many requests: slow down", http.StatusTooManyRequests)
			return
		}
		h(w, r)
	}
}

// noListing serves files but not the directories that hold them.
func noListing(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" || strings.HasSuffix(r.URL.Path, "/") {
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}
