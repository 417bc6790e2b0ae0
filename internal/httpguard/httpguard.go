// Package httpguard is the Host rule kumi's HTTP surfaces share (the web
// console, and observability's /metrics, /status and /healthz): a
// request is answered only under the host names configured, or else under
// the address it arrived on, and on a loopback address only under
// loopback names. A web page whose own host name resolves to the
// server's address (DNS rebinding) is same-origin with it, and only the
// Host header tells it apart.
package httpguard

import (
	"net"
	"net/http"
	"slices"
	"strings"
)

// AnyHost in a list of hosts turns the Host check off: for a server
// behind a reverse proxy that checks the Host itself.
const AnyHost = "*"

// IsLoopbackName reports localhost (and names under .localhost, which
// browsers resolve to loopback themselves) and loopback addresses.
func IsLoopbackName(host string) bool {
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// LocalIP is the address the request arrived on, nil when the server does
// not say (http.Server does, through http.LocalAddrContextKey).
func LocalIP(r *http.Request) net.IP {
	a, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	if a == nil {
		return nil
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return nil
	}
	return net.ParseIP(host)
}

// OnLoopback reports a request that arrived on a loopback address.
func OnLoopback(r *http.Request) bool {
	ip := LocalIP(r)
	return ip != nil && ip.IsLoopback()
}

// HostOf is a Host header's name without its port or IPv6 brackets.
func HostOf(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

// HostAllowed applies the rule: with hosts, r's Host (port aside) must be
// one of them (or hosts holds [AnyHost]); without, it must be the IP
// address r arrived on, or a loopback name when that is loopback. A
// request whose server does not say where it arrived is refused.
func HostAllowed(r *http.Request, hosts []string) bool {
	h := HostOf(r.Host)
	if len(hosts) > 0 {
		return slices.Contains(hosts, AnyHost) || slices.Contains(hosts, h)
	}
	local := LocalIP(r)
	switch {
	case local == nil:
		return false
	case local.IsLoopback():
		return IsLoopbackName(h)
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.Equal(local)
}

// ValidHost reports whether h can be a Host header's name: a host name or
// an IP address without a port, or [AnyHost].
func ValidHost(h string) bool {
	return h != "" && (!strings.ContainsAny(h, ":/[] ") || net.ParseIP(h) != nil)
}
