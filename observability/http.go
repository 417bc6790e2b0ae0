package observability

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kumi-run/kumi/internal/httpguard"
	"github.com/kumi-run/kumi/internal/redact"
)

// HandlerOptions configures Handler. Every field is optional.
type HandlerOptions struct {
	// Gatherer is what /metrics serves; nil means
	// prometheus.DefaultGatherer, where Setup registers its exporter.
	Gatherer prometheus.Gatherer
	// Telemetry, when Status is nil, supplies /status: the sources
	// registered with RegisterStatus.
	Telemetry *Telemetry
	// Status returns the value /status serves as JSON; it overrides
	// Telemetry.
	Status func(context.Context) (any, error)
	// Healthy reports whether the process is healthy; nil means always.
	Healthy func(context.Context) error
	// Token, when not "", is required of every request as the header
	// "Authorization: Bearer TOKEN" (Prometheus: authorization.credentials;
	// a Kubernetes probe: httpHeaders); others get 401.
	Token string
	// Hosts, when not empty, are the only host names (the Host header,
	// without its port) answered; others get 421. "*" answers any, for a
	// handler behind a proxy that checks the Host. Empty, the handler
	// answers the IP address a request arrived on
	// (http.LocalAddrContextKey), and on loopback only loopback names
	// (localhost, 127.0.0.1, ::1): a web page whose host name resolves
	// to the worker's address (DNS rebinding) reads nothing. A scraper
	// that reaches the worker by a name needs that name here.
	Hosts []string
}

// statusPage is the JSON /status serves when the status comes from a
// Telemetry: the JSON is the API (docs/observability.md, "HTTP endpoint";
// TestTheStatusJSONKeepsItsShape), no Go caller decodes into this type.
type statusPage struct {
	Time          time.Time            `json:"time"`
	Subscriptions []SubscriptionStatus `json:"subscriptions"`
}

// Handler returns an http.Handler serving
//
//   - GET /metrics: Prometheus text exposition of o.Gatherer;
//   - GET /healthz: 200 "ok", or 503 with the error from o.Healthy;
//   - GET /status: JSON ownership status (the time and every
//     [SubscriptionStatus] of o.Telemetry, or whatever o.Status returns),
//     500 with {"error": …} if it fails.
//
// Every response carries X-Content-Type-Options: nosniff and
// Cache-Control: no-store; a request under another host name than
// o.Hosts allows gets 421, one without o.Token 401; error messages have
// any connection string's password masked. See docs/observability.md,
// "Exposing the endpoints".
//
// Mount it on a service's own mux (for example under a prefix with
// http.StripPrefix) or run it with Serve.
func Handler(o HandlerOptions) http.Handler {
	g := o.Gatherer
	if g == nil {
		g = prometheus.DefaultGatherer
	}
	status := o.Status
	if status == nil {
		tel := o.Telemetry
		status = func(context.Context) (any, error) {
			return statusPage{Time: time.Now().UTC(), Subscriptions: tel.Status()}, nil
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if o.Healthy != nil {
			if err := o.Healthy(r.Context()); err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(redact.URL(err.Error()) + "\n"))
				return
			}
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		v, err := status(r.Context())
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			v = map[string]string{"error": redact.URL(err.Error())}
		}
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(v)
	})
	return guarded(o, mux)
}

// guarded is h behind the headers, the Host rule and the token.
func guarded(o HandlerOptions, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Cache-Control", "no-store")
		if !httpguard.HostAllowed(r, o.Hosts) {
			http.Error(w, "this endpoint does not answer to host "+strconv.Quote(r.Host)+
				" (observability.HandlerOptions.Hosts names the hosts it answers to)", http.StatusMisdirectedRequest)
			return
		}
		if o.Token != "" {
			auth, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok || subtle.ConstantTimeCompare([]byte(auth), []byte(o.Token)) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="kumi"`)
				http.Error(w, "unauthorized: send \"Authorization: Bearer TOKEN\"", http.StatusUnauthorized)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// Serve listens on addr (for example "127.0.0.1:9464", or ":0") and serves
// h until ctx is done, then shuts the server down gracefully (at most five
// seconds) and returns nil. It returns early with the error if listening
// or serving fails.
func Serve(ctx context.Context, addr string, h http.Handler) error {
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	return ServeListener(ctx, ln, h)
}

// ServeListener is Serve on a listener the caller opened (to learn the port
// of ":0" first). It closes ln.
func ServeListener(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-errc; serr != nil && !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	if errors.Is(err, context.DeadlineExceeded) {
		err = srv.Close()
	}
	return err
}
