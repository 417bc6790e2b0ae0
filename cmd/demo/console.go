package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/kumi-run/kumi/console"
)

// consoleOff is the -console value that serves no console.
const consoleOff = "off"

// checkConsoleAddr refuses a -console value that is neither HOST:PORT nor
// off, and one beyond loopback: the demo's console has no token, and
// console.CheckListen refuses a console without one there.
func checkConsoleAddr(addr string) error {
	if addr == consoleOff {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return fmt.Errorf("-console %q: use HOST:PORT (127.0.0.1:0 picks a free loopback port) or %s", addr, consoleOff)
	}
	if console.CheckListen(addr, console.Options{}) != nil {
		return fmt.Errorf("-console %s: the demo's console has no token, so it serves on loopback only "+
			"(from another machine, ssh -L 7070:127.0.0.1:7070 and -console 127.0.0.1:7070)", addr)
	}
	return nil
}

// serveConsole serves the web console (package console, read-only) on
// addr for the demo's schema, with the demo's category so that it shows
// each bucket's lag. It returns the address of the demo subscription's
// page and a function that stops the server.
func serveConsole(addr string, db *database) (pageURL string, stop func(), err error) {
	// No Hosts: on loopback, the console answers loopback names only, so
	// a web page whose host name resolves to 127.0.0.1 (DNS rebinding)
	// gets nothing.
	opts := console.Options{Store: db.store, Categories: map[string]string{subscription: category},
		Logger: slog.New(slog.DiscardHandler)}
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
