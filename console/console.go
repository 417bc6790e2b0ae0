package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/httpguard"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/redact"
	"github.com/kumi-run/kumi/kumierr"
)

//go:embed assets
var assets embed.FS

// ReplayFunc handles one replayed dead-lettered event of subscription: a
// nil return marks the letter replayed, an error leaves it pending with its
// attempts counted (see eventsource.Store.ReplayDeadLetters).
type ReplayFunc func(ctx context.Context, subscription string, event eventsource.RecordedEvent) error

// Options configure a [Console].
type Options struct {
	// Store is the event store whose schema the console shows. Required.
	Store *eventsource.Store
	// Reads, when set, is a store on a hot standby of Store's database, of
	// the same schema. The console's heavy reads — the buckets' lag, the
	// pending dead letters counted on a subscription's page, the
	// overview's checkpoint and dead letter counts — are read there, as of
	// its replay, as `kumi status --read-url` does. The leases, resizes,
	// checkpoints and head stay on Store (current, and the session locks
	// that tell a session worker live are the primary's), and so do the
	// dead-letter pages, which show what the actions change. Nil reads
	// everything through Store.
	Reads *eventsource.Store
	// Categories maps a subscription to its category, so the console can
	// measure each bucket's lag (the lease tables do not record it). A
	// subscription missing here is shown without lag.
	Categories map[string]string
	// Token, when not "", is required of every request: as the header
	// "Authorization: Bearer TOKEN", or once as ?token=TOKEN, which sets a
	// cookie. 16 to 256 bytes, no white space or control characters.
	Token string
	// AllowActions enables the actions (relinquish a bucket, reset its
	// checkpoint, replay or discard dead letters). Off by default: the
	// console is read-only.
	AllowActions bool
	// Replay handles the replay action; nil leaves replay out even when
	// actions are allowed (the console cannot run a service's handler by
	// itself).
	Replay ReplayFunc
	// AllowReadsWithoutToken lets a read-only console without a Token
	// answer beyond loopback: anyone who reaches it then reads every
	// subscription's state and dead letters, event data included. Without
	// it (and always with AllowActions) a console with no token answers
	// requests on a loopback address only, and refuses others with 403.
	AllowReadsWithoutToken bool
	// Hosts, when not empty, are the only host names (the Host header,
	// without its port) the console answers; others get 421. [AnyHost]
	// answers any, for a console behind a proxy that checks the Host.
	// Empty, the console answers the address the request arrived on
	// (http.LocalAddrContextKey) by IP, and when that is loopback only
	// loopback names (localhost, 127.0.0.1, ::1): a web page whose own host
	// name resolves to the console's address (DNS rebinding) gets nothing.
	// A console whose users reach it by a name needs that name here.
	Hosts []string
	// Logger receives one record per action; nil uses slog.Default().
	Logger *slog.Logger
}

// Console is the web console: an [http.Handler]. Build one with [New]; it
// is safe for concurrent use and holds no goroutine of its own.
type Console struct {
	opts    Options
	log     *slog.Logger
	csrf    string // the per-process token every action must carry
	handler http.Handler
	pages   pages
	limit   *limiter
	looks   *looks[subState]
	series  *series                               // the charts' points
	summary *looks[[]inspect.SubscriptionSummary] // the overview's, under ""
}

// csrfHeader is the request header that carries the console's per-process
// action token (the page's data-csrf attribute): the page's script sets
// it, no Go caller.
const csrfHeader = "X-Kumi-Csrf"

// tokenCookie holds the bearer token in the browser after ?token=.
const tokenCookie = "kumi_console_token"

// contentSecurityPolicy allows the console's own script, style and images
// and nothing else: no inline script, no framing, no other origin.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// New checks opts and builds a console. An invalid option is refused with
// a *[kumierr.ConfigError] naming it.
func New(opts Options) (*Console, error) {
	if opts.Store == nil {
		return nil, &kumierr.ConfigError{Field: "console.Options.Store", Reason: "is nil: the console needs the event store whose schema it shows"}
	}
	for sub, cat := range opts.Categories {
		if err := eventsource.ValidateSubscription(sub); err != nil {
			return nil, &kumierr.ConfigError{Field: fmt.Sprintf("console.Options.Categories[%q]", sub), Value: cat, Reason: err.Error()}
		}
		if err := eventsource.ValidateCategory(cat); err != nil {
			return nil, &kumierr.ConfigError{Field: fmt.Sprintf("console.Options.Categories[%q]", sub), Value: cat, Reason: err.Error()}
		}
	}
	for i, h := range opts.Hosts {
		if !httpguard.ValidHost(h) {
			return nil, &kumierr.ConfigError{Field: fmt.Sprintf("console.Options.Hosts[%d]", i), Value: h, Reason: "must be a host name or an IP address, without a port"}
		}
	}
	if opts.Token != "" {
		if n := len(opts.Token); n < 16 || n > 256 {
			return nil, &kumierr.ConfigError{Field: "console.Options.Token", Reason: fmt.Sprintf("%d bytes: must be 16 to 256 bytes (or empty for no token)", n)}
		}
		if strings.IndexFunc(opts.Token, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
			return nil, &kumierr.ConfigError{Field: "console.Options.Token", Reason: "contains white space or control characters"}
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("console: csrf token: %w", err)
	}
	pg, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{opts: opts, log: log.With("component", "kumi-console"), csrf: hex.EncodeToString(b[:]),
		pages: pg, limit: newLimiter(), series: newSeries()}
	c.looks = newLooks(c.look)
	c.summary = newLooks(func(ctx context.Context, _ string) ([]inspect.SubscriptionSummary, error) {
		return c.subscriptions(ctx)
	})
	c.handler = c.routes()
	return c, nil
}

// ServeHTTP serves the console: security headers on every response, the
// Host, token and cross-site checks (guard.go), the bearer token when one
// is set, then the page, the JSON or the action.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	if c.guard(w, r) {
		return
	}
	if c.opts.Token != "" && !c.authorized(w, r) {
		return
	}
	c.handler.ServeHTTP(w, r)
}

// authorized checks the bearer token; it answers the request itself (401,
// or a redirect that drops ?token= from the address) when it returns false.
func (c *Console) authorized(w http.ResponseWriter, r *http.Request) bool {
	if auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok && c.tokenIs(auth) {
		return true
	}
	if ck, err := r.Cookie(tokenCookie); err == nil && c.tokenIs(ck.Value) {
		return true
	}
	if q := r.URL.Query(); r.Method == http.MethodGet && q.Has("token") && c.tokenIs(q.Get("token")) {
		http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: c.opts.Token, Path: "/", HttpOnly: true,
			SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		q.Del("token")
		// Relative, not http.Redirect's absolute path: the console may be
		// mounted under a prefix that r.URL no longer shows.
		u := url.URL{Path: pathBase(r), RawQuery: q.Encode()}
		w.Header().Set("Location", u.String())
		w.WriteHeader(http.StatusSeeOther)
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="kumi console"`)
	http.Error(w, "unauthorized: this console needs its token, as the header \"Authorization: Bearer TOKEN\" "+
		"or once in the address as ?token=TOKEN", http.StatusUnauthorized)
	return false
}

func (c *Console) tokenIs(s string) bool {
	return subtle.ConstantTimeCompare([]byte(s), []byte(c.opts.Token)) == 1
}

// pathBase is the last segment of the request's path, for a redirect
// relative to the current page (the console may be mounted under a prefix).
func pathBase(r *http.Request) string {
	p := r.URL.EscapedPath()
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if p == "" {
		return "./"
	}
	return p
}

// root is the relative path from the request's page to the console's
// root, "./" or "../../" say, so links work under any mount prefix.
func root(r *http.Request) string {
	n := strings.Count(r.URL.EscapedPath(), "/") - 1
	if n <= 0 {
		return "./"
	}
	return strings.Repeat("../", n)
}

func (c *Console) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", c.overviewPage)
	mux.HandleFunc("GET /s/{sub}", c.subscriptionPage)
	mux.HandleFunc("GET /s/{sub}/letters", c.limited(c.lettersPage))
	mux.HandleFunc("GET /s/{sub}/letters/{id}", c.limited(c.letterPage))
	mux.HandleFunc("GET /api/overview", c.overviewJSON)
	mux.HandleFunc("GET /api/s/{sub}", c.subscriptionJSON)

	static, _ := fs.Sub(assets, "assets/static")
	files := http.FileServerFS(static)
	mux.Handle("GET /assets/", http.StripPrefix("/assets", noListing(files)))
	mux.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, static, "favicon.svg")
	})

	// Actions: POST only, the per-process token, and no cross-origin
	// request (Sec-Fetch-Site / Origin against Host).
	actions := http.NewServeMux()
	actions.HandleFunc("POST /api/s/{sub}/buckets/{bucket}/relinquish", c.relinquishAction)
	actions.HandleFunc("POST /api/s/{sub}/buckets/{bucket}/reset", c.resetAction)
	actions.HandleFunc("POST /api/s/{sub}/letters/{id}/replay", c.replayAction)
	actions.HandleFunc("POST /api/s/{sub}/letters/{id}/discard", c.discardAction)
	actions.HandleFunc("POST /api/s/{sub}/parked/{action}", c.parkedAction)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.log.Warn("console action refused: cross-origin request", "path", r.URL.Path, "origin", r.Header.Get("Origin"),
			"remote", r.RemoteAddr)
		writeError(w, http.StatusForbidden, "cross-origin request refused")
	}))
	mux.Handle("POST /api/", cop.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !c.opts.AllowActions {
			c.log.Warn("console action refused: actions are disabled", "path", r.URL.Path, "remote", r.RemoteAddr)
			writeError(w, http.StatusForbidden, "actions are disabled: this console is read-only "+
				"(Options.AllowActions, or kumi console --allow-actions)")
			return
		}
		if subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(c.csrf)) != 1 {
			c.log.Warn("console action refused: missing or wrong CSRF token", "path", r.URL.Path, "remote", r.RemoteAddr)
			writeError(w, http.StatusForbidden, "missing or wrong "+csrfHeader+" token: reload the page")
			return
		}
		actions.ServeHTTP(w, r)
	})))
	return mux
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes {"error": msg}, with any connection string redacted.
func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]string{"error": redact.URL(msg)})
}
