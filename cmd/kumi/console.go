package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/kumi-run/kumi/console"
	"github.com/kumi-run/kumi/eventsource"
)

type consoleCmd struct {
	Listen       string            `default:"127.0.0.1:7070" placeholder:"HOST:PORT" help:"Address to serve on; loopback unless told otherwise (0.0.0.0:7070 serves every interface: set --token then)."`
	Token        string            `env:"KUMI_CONSOLE_TOKEN" placeholder:"TOKEN" help:"Require this bearer token (16 to 256 bytes): the header \"Authorization: Bearer TOKEN\", or ?token=TOKEN once in the browser. Never printed."`
	AllowActions bool              `name:"allow-actions" help:"Enable the actions: relinquish a bucket, reset a checkpoint, discard dead letters, and replay them with --replay-exec. Off: the console is read-only."`
	ReplayExec   string            `name:"replay-exec" placeholder:"COMMAND" help:"With --allow-actions, replay a dead letter through this shell command, as \"kumi dead-letters replay --exec\" does."`
	Category     map[string]string `short:"c" placeholder:"SUB=CATEGORY" help:"A subscription's category, to measure its buckets' lag (repeatable)."`
	ReadURL      string            `name:"read-url" env:"KUMI_READ_URL" placeholder:"URL" help:"A hot standby of the database: the heavy reads go there (the buckets' lag, the checkpoint and dead letter counts). Never printed."`
}

// Run serves the console until interrupted.
func (c *consoleCmd) Run(e *env) error {
	if c.ReplayExec != "" && !c.AllowActions {
		return usageErrorf("--replay-exec is an action: it needs --allow-actions")
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	opts := console.Options{Store: store, Categories: c.Category, Token: c.Token, AllowActions: c.AllowActions,
		Logger: log}
	if c.ReadURL != "" {
		if opts.Reads, err = e.connectReads(c.ReadURL); err != nil {
			return err
		}
	}
	if c.ReplayExec != "" {
		opts.Replay = func(ctx context.Context, sub string, ev eventsource.RecordedEvent) error {
			return (&dlReplayCmd{Subscription: sub, Exec: c.ReplayExec}).handler(e)(ctx, ev)
		}
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return usageErrorf("--listen %s: %v", c.Listen, err)
	}
	if isLoopback(host) {
		// Only loopback names: a web page whose host name resolves to
		// 127.0.0.1 (DNS rebinding) gets nothing.
		opts.Hosts = append(slices.Clone(console.LoopbackHosts), host)
	}
	h, err := console.New(opts)
	if err != nil {
		var oe *console.OptionError
		if errors.As(err, &oe) {
			return usageErrorf("%v", err)
		}
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return usageErrorf("--listen %s: %v", c.Listen, err)
	}
	if c.Token == "" && !isLoopback(host) {
		log.Warn("the console serves beyond loopback without a token: anyone who reaches it sees the subscriptions",
			"listen", c.Listen)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	mode := "read-only"
	if c.AllowActions {
		mode = "actions enabled"
	}
	fmt.Fprintf(e.stdout, "kumi console (%s) on http://%s/ for schema %q; Ctrl-C stops it\n", mode, ln.Addr(), store.Schema())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-e.ctx.Done():
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
