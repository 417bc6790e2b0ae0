// Package console is kumi's web console: an [http.Handler] that shows a
// schema's subscriptions — workers, a map of bucket ownership and lag, dead
// letters and a timeline of ownership changes — and updates itself while
// it is open. Mount it next to /metrics, or run it standalone with
// `kumi console` (docs/console.md).
//
//	h, err := console.New(console.Options{Store: store})
//	mux.Handle("/console/", http.StripPrefix("/console", h))
//
// It is read-only unless [Options.AllowActions] is set; then it can ask the
// owner of a bucket to hand it over (the two-phase handoff `kumi
// relinquish` places), discard dead letters and — with [Options.Replay] —
// replay them. Actions are POST requests carrying a per-process token, a
// request from another origin is refused, and each is logged.
//
// It reads the tables directly, as `kumi status` does
// (internal/inspect.Inspect): it never joins a pool, so it does not change
// any worker's fair share. Every value is escaped (html/template on the
// server, textContent in the browser), the Content-Security-Policy allows
// no inline script, and nothing it shows or logs contains the connection
// string.
package console
