package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/worker"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

// cli is the command line: global flags and one field per command.
type cli struct {
	DatabaseURL string `name:"database-url" env:"DATABASE_URL" placeholder:"URL" help:"PostgreSQL connection string, e.g. postgres://user:password@host:5432/db Never printed."`
	Schema      string `name:"schema" env:"KUMI_SCHEMA" default:"kumi" placeholder:"NAME" help:"Schema holding kumi's tables."`

	Migrate     migrateCmd     `cmd:"" help:"Create or upgrade kumi's tables (event store and leases); idempotent."`
	Status      statusCmd      `cmd:"" help:"Show members, and for each bucket its owner, epoch, lease expiry, checkpoint and lag."`
	DeadLetters deadLettersCmd `cmd:"" name:"dead-letters" help:"List, show, replay or discard the events a subscription gave up on."`
	Checkpoints checkpointsCmd `cmd:"" help:"Show or reset a subscription's checkpoints."`
	Relinquish  relinquishCmd  `cmd:"" help:"Ask the owner of a bucket to drain it and hand it over."`
	Console     consoleCmd     `cmd:"" help:"Serve the web console: subscriptions, bucket map, dead letters, ownership timeline."`
}

// env is what every command's Run receives.
type env struct {
	ctx    context.Context
	url    string
	schema string
	stdout io.Writer
	stderr io.Writer

	pool  *pgxpool.Pool
	store *eventsource.Store
}

// connect opens the pool and the store on first use.
func (e *env) connect() (*eventsource.Store, error) {
	if e.store != nil {
		return e.store, nil
	}
	if e.url == "" {
		return nil, usageErrorf("no database: set DATABASE_URL or pass --database-url")
	}
	pool, err := worker.ConnectPool(e.ctx, e.url, 4)
	if err != nil {
		return nil, err
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.schema})
	if err != nil {
		pool.Close()
		return nil, usageErrorf("--schema: %v", err)
	}
	e.pool, e.store = pool, store
	return store, nil
}

func (e *env) close() {
	if e.pool != nil {
		e.pool.Close()
	}
}

// printJSON writes v as indented JSON.
func (e *env) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// usageError is a problem with the arguments found after parsing: exit 2.
type usageError struct{ msg string }

// Error returns the message.
func (u *usageError) Error() string { return u.msg }

func usageErrorf(format string, args ...any) error {
	return &usageError{msg: fmt.Sprintf(format, args...)}
}

// kongExit carries a code out of kong's Exit hook (help, --version).
type kongExit int

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run parses args, runs the command and returns the exit code.
func run(args []string, stdout, stderr io.Writer) (code int) {
	if len(args) == 0 {
		// No command is a usage error: the help goes to stderr.
		run([]string{"--help"}, stderr, stderr)
		return exitUsage
	}
	var c cli
	parser, err := kong.New(&c,
		kong.Name("kumi"),
		kong.Description("Operate kumi subscriptions: the state of their buckets, their checkpoints and dead letters."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(kongExit(code)) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, NoExpandSubcommands: true}),
	)
	if err != nil {
		fmt.Fprintf(stderr, "kumi: internal error: %v\n", err)
		return exitRuntime
	}
	defer func() {
		if r := recover(); r != nil {
			k, ok := r.(kongExit)
			if !ok {
				panic(r)
			}
			code = int(k)
		}
	}()
	kctx, err := parser.Parse(args)
	if err != nil {
		var pe *kong.ParseError
		if errors.As(err, &pe) {
			kctx = pe.Context
		}
		fmt.Fprintf(stderr, "kumi: %s\n", worker.RedactURL(err.Error()))
		fmt.Fprintf(stderr, "Run \"kumi %s--help\" for usage.\n", commandPath(kctx))
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	e := &env{ctx: ctx, url: c.DatabaseURL, schema: c.Schema, stdout: stdout, stderr: stderr}
	defer e.close()
	if err := kctx.Run(e); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "kumi %s: %s\n", strings.TrimSpace(commandPath(kctx)), ue.msg)
			return exitUsage
		}
		fmt.Fprintf(stderr, "kumi %s: %s\n", strings.TrimSpace(commandPath(kctx)), worker.RedactURL(err.Error()))
		return exitRuntime
	}
	return exitOK
}

// commandPath is the command being run, "dead-letters list " say, or "".
func commandPath(kctx *kong.Context) string {
	if kctx == nil {
		return ""
	}
	var parts []string
	for _, p := range kctx.Path {
		if p.Command != nil {
			parts = append(parts, p.Command.Name)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return strings.Join(parts, " ") + " "
}

// asUsage makes the store's verdict on a name the user typed a usage error.
func asUsage(err error) error {
	if errors.Is(err, eventsource.ErrInvalidName) || errors.Is(err, eventsource.ErrInvalidCheckpoint) {
		return &usageError{msg: err.Error()}
	}
	return err
}
