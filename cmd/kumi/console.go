package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kumi-run/kumi/console"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/httpguard"
	"github.com/kumi-run/kumi/kumierr"
)

type consoleCmd struct {
	Listen                 string            `default:"127.0.0.1:7070" placeholder:"HOST:PORT" help:"Address to serve on; loopback unless told otherwise. Beyond loopback (0.0.0.0:7070 serves every interface) it needs a token, and without --allow-actions it may instead be told --allow-reads-without-token."`
	Token                  string            `env:"KUMI_CONSOLE_TOKEN" placeholder:"TOKEN" help:"Require this bearer token (16 to 256 bytes): the header \"Authorization: Bearer TOKEN\", or ?token=TOKEN once in the browser. Never printed. Prefer $KUMI_CONSOLE_TOKEN or --token-file: on the command line, ps shows it to every local user."`
	TokenFile              string            `name:"token-file" type:"existingfile" placeholder:"PATH" help:"Read the token from this file (its trailing newline dropped), which ps does not show."`
	AllowActions           bool              `name:"allow-actions" help:"Enable the actions: relinquish a bucket, reset a checkpoint, discard dead letters, and replay them with --replay-exec. Off: the console is read-only."`
	AllowReadsWithoutToken bool              `name:"allow-reads-without-token" help:"Serve a read-only console beyond loopback without a token: anyone who reaches it reads every subscription's state and dead letters, event data included."`
	Host                   []string          `name:"host" placeholder:"NAME" help:"A host name the console answers to (the Host header, without its port; repeatable). Default: the address a request arrives on, and on loopback only loopback names, so that a web page whose name resolves to it (DNS rebinding) gets nothing."`
	TLSCert                string            `name:"tls-cert" type:"existingfile" placeholder:"PATH" help:"Serve HTTPS with this certificate (PEM, with its chain); needs --tls-key. Beyond loopback without it, the token travels in clear."`
	TLSKey                 string            `name:"tls-key" type:"existingfile" placeholder:"PATH" help:"The private key of --tls-cert (PEM)."`
	ReplayExec             string            `name:"replay-exec" placeholder:"COMMAND" help:"With --allow-actions, replay a dead letter through this shell command, as \"kumi dead-letters replay --exec\" does."`
	Category               map[string]string `short:"c" placeholder:"SUB=CATEGORY" help:"A subscription's category, to measure its buckets' lag (repeatable)."`
	ReadURL                string            `name:"read-url" env:"KUMI_READ_URL" placeholder:"URL" help:"A hot standby of the database: the heavy reads go there (the buckets' lag, the checkpoint and dead letter counts). Never printed."`
}

// Run serves the console until interrupted.
func (c *consoleCmd) Run(e *env) error {
	if c.ReplayExec != "" && !c.AllowActions {
		return usageErrorf("--replay-exec is an action: it needs --allow-actions")
	}
	if err := c.readToken(); err != nil {
		return err
	}
	var certs []tls.Certificate
	if (c.TLSCert == "") != (c.TLSKey == "") {
		return usageErrorf("--tls-cert and --tls-key go together")
	}
	if c.TLSCert != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCert, c.TLSKey)
		if err != nil {
			return usageErrorf("--tls-cert/--tls-key: %v", err)
		}
		certs = []tls.Certificate{cert}
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return usageErrorf("--listen %s: %v", c.Listen, err)
	}
	// Before connecting: a console that may not serve there does not start.
	if console.CheckListen(c.Listen, console.Options{Token: c.Token, AllowActions: c.AllowActions,
		AllowReadsWithoutToken: c.AllowReadsWithoutToken}) != nil {
		if c.AllowActions {
			return usageErrorf("--listen %s --allow-actions without a token: anyone who reaches it could reset checkpoints "+
				"and discard dead letters; give it a token (--token-file or $KUMI_CONSOLE_TOKEN) or serve on loopback", c.Listen)
		}
		return usageErrorf("--listen %s without a token: anyone who reaches it reads every subscription's state and "+
			"dead letters, event data included; give it a token (--token-file or $KUMI_CONSOLE_TOKEN), serve on loopback, "+
			"or say it is meant (--allow-reads-without-token)", c.Listen)
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	opts := console.Options{Store: store, Categories: c.Category, Token: c.Token, AllowActions: c.AllowActions,
		AllowReadsWithoutToken: c.AllowReadsWithoutToken, Hosts: c.Host, Logger: log}
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
	h, err := console.New(opts)
	if err != nil {
		var oe *kumierr.ConfigError
		if errors.As(err, &oe) {
			if flag, ok := consoleFlags[oe.Field]; ok {
				return usageErrorf("%s: %s", flag, oe.Reason)
			}
			return usageErrorf("%v", err)
		}
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return usageErrorf("--listen %s: %v", c.Listen, err)
	}
	if !httpguard.IsLoopbackName(host) {
		if c.Token == "" {
			log.Warn("the console serves beyond loopback without a token: anyone who reaches it reads every "+
				"subscription's state and dead letters, event data included", "listen", c.Listen)
		} else if certs == nil {
			log.Warn("the console serves beyond loopback without TLS: its token travels in clear "+
				"(--tls-cert/--tls-key, or a TLS proxy in front)", "listen", c.Listen)
		}
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	mode, scheme := "read-only", "http"
	if c.AllowActions {
		mode = "actions enabled"
	}
	if certs != nil {
		srv.TLSConfig = &tls.Config{Certificates: certs, MinVersion: tls.VersionTLS12}
		ln, scheme = tls.NewListener(ln, srv.TLSConfig), "https"
	}
	fmt.Fprintf(e.stdout, "kumi console (%s) on %s://%s/ for schema %q; Ctrl-C stops it\n", mode, scheme, ln.Addr(), store.Schema())
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

// readToken takes the token from --token-file, unless --token (or
// $KUMI_CONSOLE_TOKEN) gave one too, which is refused.
func (c *consoleCmd) readToken() error {
	if c.TokenFile == "" {
		return nil
	}
	if c.Token != "" {
		return usageErrorf("--token-file and --token (or $KUMI_CONSOLE_TOKEN): give the token once")
	}
	b, err := os.ReadFile(c.TokenFile)
	if err != nil {
		return usageErrorf("--token-file: %v", err)
	}
	c.Token = strings.TrimRight(string(b), "\r\n")
	if c.Token == "" {
		return usageErrorf("--token-file %s is empty", c.TokenFile)
	}
	return nil
}

// consoleFlags names the flag behind each console option the command sets
// from one, for its usage errors.
var consoleFlags = map[string]string{"console.Options.Token": "--token"}
