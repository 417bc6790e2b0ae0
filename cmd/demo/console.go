package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"time"

	"github.com/kumi-run/kumi/console"
)

// consoleOff is the -console value that serves no console.
const consoleOff = "off"

// checkConsoleAddr refuses a -console value that is neither HOST:PORT nor
// off.
func checkConsoleAddr(addr string) error {
	if addr == consoleOff {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("-console %q: use HOST:PORT (127.0.0.1:0 picks a free loopback port) or %s", addr, consoleOff)
	}
	return nil
}

// serveConsole serves the web console (package console, read-only) on
// addr for the demo's schema, with the demo's category so that it shows
// each bucket's lag. It returns the address of the demo subscription's
// page and a function that stops the server.
func serveConsole(addr string, db *database) (pageURL string, stop func(), err error) {
	host, _, _ := net.SplitHostPort(addr)
	opts := console.Options{Store: db.store, Categories: map[string]string{subscription: category},
		Logger: slog.New(slog.DiscardHandler)}
	if ip := net.ParseIP(host); host == "localhost" || ip != nil && ip.IsLoopback() {
		// Only loopback names: a web page whose host name resolves to
		// 127.0.0.1 (DNS rebinding) gets nothing.
		opts.Hosts = append(slices.Clone(console.LoopbackHosts), host)
	}
	c, err := console.New(opts)
	if err != nil {
		return "", nil, fmt.Errorf("the console: %w", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("-console %s: %w (pass another address, or -console %s)", addr, err, consoleOff)
	}
	srv := &http.Server{Handler: c, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	u := url.URL{Scheme: "http", Host: ln.Addr().String(), Path: "/s/" + subscription}
	return u.String(), func() {
		_ = srv.Close()
		<-served
	}, nil
}
