package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/alecthomas/kong"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/dburl"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/redact"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
)

// Exit codes.
const (
	exitOK      = 0
	exitRuntime = 1
	exitUsage   = 2
)

// cli is the command line: global flags and one field per command.
type cli struct {
	DatabaseURL string           `name:"database-url" env:"DATABASE_URL" placeholder:"URL" help:"PostgreSQL connection string, e.g. postgres://user:password@host:5432/db Never printed."`
	Schema      string           `name:"schema" env:"KUMI_SCHEMA" default:"kumi" placeholder:"NAME" help:"Schema holding kumi's tables (default: ${default})."`
	Version     kong.VersionFlag `name:"version" help:"Print kumi's version (its module version, or the commit it was built from) and exit."`

	Migrate     migrateCmd     `cmd:"" help:"Create or upgrade kumi's tables (event store and leases); idempotent."`
	Status      statusCmd      `cmd:"" help:"Show workers, and for each bucket its owner, epoch, lease expiry, checkpoint and lag."`
	DeadLetters deadLettersCmd `cmd:"" name:"dead-letters" help:"List, show, replay or discard the events a subscription gave up on."`
	Parked      parkedCmd      `cmd:"" help:"List a subscription's parked streams; replay, discard or skip one."`
	Checkpoints checkpointsCmd `cmd:"" help:"Show or reset a subscription's checkpoints."`
	Relinquish  relinquishCmd  `cmd:"" help:"Ask the owner of a bucket to drain it and hand it over."`
	Resize      resizeCmd      `cmd:"" help:"Change a subscription's bucket count while its workers run; cancel or follow a resize."`
	Console     consoleCmd     `cmd:"" help:"Serve the web console: subscriptions, bucket map, dead letters, ownership timeline."`
}

// env is what every command's Run receives.
type env struct {
	ctx    context.Context
	url    string
	schema string
	// app is the pools' application_name, "kumi status" say, unless the
	// URL sets one: the ownership record names who made a change by it.
	app string
	// stdout and stderr escape what a terminal would act on
	// (termsafe.NewWriter); rawStdout and rawStderr are the process's
	// own, for the commands `dead-letters replay --exec` runs.
	stdout, stderr       io.Writer
	rawStdout, rawStderr io.Writer

	pool  *pgxpool.Pool
	store *eventsource.Store
	// readPool is connectReads's pool.
	readPool *pgxpool.Pool
}

// connect opens the pool and the store on first use.
func (e *env) connect() (*eventsource.Store, error) {
	if e.store != nil {
		return e.store, nil
	}
	pool, err := dburl.Connect(e.ctx, e.url, 4, e.app)
	var ue *dburl.Error
	if errors.As(err, &ue) { // a bad value, not a failed database
		return nil, &usageError{msg: ue.Error()}
	}
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

// connectReads opens a store on url (a hot standby, for a command's
// heavy reads), closed with the env.
func (e *env) connectReads(url string) (*eventsource.Store, error) {
	pool, err := dburl.Connect(e.ctx, url, 4, e.app)
	var ue *dburl.Error
	if errors.As(err, &ue) {
		return nil, &usageError{msg: "--read-url: " + ue.Error()}
	}
	if err != nil {
		return nil, fmt.Errorf("--read-url: %w", err)
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.schema})
	if err != nil {
		pool.Close()
		return nil, usageErrorf("--schema: %v", err)
	}
	e.readPool = pool
	return store, nil
}

func (e *env) close() {
	if e.pool != nil {
		e.pool.Close()
	}
	if e.readPool != nil {
		e.readPool.Close()
	}
}

// printJSON writes v as indented JSON, safe for a terminal
// (termsafe.JSON).
func (e *env) printJSON(v any) error {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return err
	}
	_, err := e.stdout.Write(termsafe.JSON(b.Bytes()))
	return err
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
func run(args []string, rawStdout, rawStderr io.Writer) (code int) {
	// Everything printed passes through a TermWriter: values from the
	// database are escaped where they are formatted, and whatever is
	// missed there still never reaches the terminal raw.
	stdout, stderr := termsafe.NewWriter(rawStdout), termsafe.NewWriter(rawStderr)
	defer func() { _ = stdout.Flush(); _ = stderr.Flush() }()
	if len(args) == 0 {
		// No command is a usage error: the help goes to stderr.
		run([]string{"--help"}, rawStderr, rawStderr)
		return exitUsage
	}
	var c cli
	parser, err := kong.New(&c,
		kong.Name("kumi"),
		kong.Description("Operate kumi subscriptions: the state of their buckets, their checkpoints and dead letters."),
		kong.Writers(stdout, stderr),
		kong.Exit(func(code int) { panic(kongExit(code)) }),
		kong.ConfigureHelp(kong.HelpOptions{Compact: true, NoExpandSubcommands: true}),
		helpVars(),
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
	kctx, err := parser.Parse(joinNegativeValues(args, valueFlags(parser.Model.Node)))
	if err == nil {
		err = checkBuckets(kctx)
	}
	if err != nil {
		var pe *kong.ParseError
		if errors.As(err, &pe) {
			kctx = pe.Context
		}
		fmt.Fprintf(stderr, "%s%s\n", commandPrefix(kctx), redact.URL(parseMessage(err)))
		fmt.Fprintf(stderr, "Run \"kumi %s--help\" for usage.\n", commandPath(kctx))
		return exitUsage
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	e := &env{ctx: ctx, url: c.DatabaseURL, schema: c.Schema, app: strings.TrimSpace("kumi " + commandPath(kctx)),
		stdout: stdout, stderr: stderr,
		rawStdout: rawStdout, rawStderr: rawStderr}
	defer e.close()
	if err := kctx.Run(e); err != nil {
		var ue *usageError
		if errors.As(err, &ue) {
			fmt.Fprintf(stderr, "%s%s\n", commandPrefix(kctx), message(kctx, ue))
			return exitUsage
		}
		fmt.Fprintf(stderr, "%s%s\n", commandPrefix(kctx), message(kctx, err))
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

// message is err's text as the CLI prints it after "kumi COMMAND: ":
// redacted, without the "kumi: " the library's errors start with (and
// wrapped ones carry), which would say kumi twice, nor the package name a
// command's namesake package starts its errors with ("console: " after
// "kumi console: ").
func message(kctx *kong.Context, err error) string {
	msg := strings.TrimPrefix(redact.URL(err.Error()), "kumi: ")
	if cmd, _, _ := strings.Cut(commandPath(kctx), " "); cmd != "" {
		msg = strings.TrimPrefix(msg, cmd+": ")
	}
	return strings.ReplaceAll(msg, ": kumi: ", ": ")
}

// commandPrefix is "kumi dead-letters list: " for a message about that
// command, or "kumi: " before a command is known.
func commandPrefix(kctx *kong.Context) string {
	if p := strings.TrimSpace(commandPath(kctx)); p != "" {
		return "kumi " + p + ": "
	}
	return "kumi: "
}

// missingValue is kong's message for a flag given last with no value:
// `--subscription: expected string value but got "EOL" (<EOL>)`.
var missingValue = regexp.MustCompile(`^(--[a-z-]+): expected \w+ value but got "EOL" \(<EOL>\)$`)

// parseMessage is a parse error's text, kong's "EOL" said in words.
func parseMessage(err error) string {
	if m := missingValue.FindStringSubmatch(err.Error()); m != nil {
		return m[1] + " needs a value"
	}
	return err.Error()
}

// helpVars are the variables the help texts use: --version's text and the
// bucket limit.
func helpVars() kong.Vars {
	return kong.Vars{"version": version(), "max_buckets": strconv.Itoa(leasestore.MaxBuckets)}
}

// version is the module's version when built from a tagged module, else
// the commit it was built from (with "+dirty" for local changes).
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "kumi (unknown version)"
	}
	v := info.Main.Version
	var rev, dirty string
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				dirty = "+dirty"
			}
		}
	}
	if (v == "" || v == "(devel)") && rev != "" {
		v = "commit " + rev[:min(12, len(rev))] + dirty
	}
	return "kumi " + v + " (" + info.GoVersion + ")"
}

// valueFlags returns the long names ("--bucket") of the flags of node and
// its commands that take a value.
func valueFlags(node *kong.Node) map[string]bool {
	out := map[string]bool{}
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			if !f.IsBool() && !f.IsCounter() {
				out["--"+f.Name] = true
			}
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(node)
	return out
}

// negativeValue is a value that starts like a negative number or
// duration: "-1", "-5s", "-.5".
var negativeValue = regexp.MustCompile(`^-[0-9.]`)

// joinNegativeValues rewrites "--bucket -1" as "--bucket=-1": the parser
// takes a separate "-1" for a short flag and says so, where the command's
// own check gives the range. Arguments after "--" are left alone.
func joinNegativeValues(args []string, value map[string]bool) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return append(out, args[i:]...)
		}
		if value[a] && i+1 < len(args) && negativeValue.MatchString(args[i+1]) {
			out = append(out, a+"="+args[i+1])
			i++
			continue
		}
		out = append(out, a)
	}
	return out
}

// checkBuckets refuses a --bucket outside 0 to leasestore.MaxBuckets-1,
// whatever the command, before any database is asked: PostgreSQL would
// refuse one beyond int4 with an encoder's message.
func checkBuckets(kctx *kong.Context) error {
	for _, f := range kctx.Flags() {
		if f.Name != "bucket" || !f.Set {
			continue
		}
		var buckets []int
		switch v := kctx.FlagValue(f).(type) {
		case int:
			buckets = []int{v}
		case *int:
			if v != nil {
				buckets = []int{*v}
			}
		case []int:
			buckets = v
		}
		for _, b := range buckets {
			if b < 0 || b >= leasestore.MaxBuckets {
				return usageErrorf("--bucket %d: buckets are numbered from 0 to %d at most", b, leasestore.MaxBuckets-1)
			}
		}
	}
	return nil
}

// checkSubscription refuses a subscription the schema does not know (no
// lease rows, checkpoints or dead letters), and buckets beyond its N.
func (e *env) checkSubscription(name string, buckets ...int) error {
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := eventsource.ValidateSubscription(name); err != nil {
		return asUsage(err)
	}
	n, known, err := inspect.Known(e.ctx, store, name)
	if err != nil {
		return err
	}
	if !known {
		return unknownSubscription(name, store.Schema())
	}
	for _, b := range buckets {
		if n > 0 && b >= n {
			return usageErrorf("--bucket %d: subscription %q has buckets 0 to %d", b, name, n-1)
		}
	}
	return nil
}

// unknownSubscription says that name has no buckets, checkpoints or dead
// letters in schema.
func unknownSubscription(name, schema string) error {
	return fmt.Errorf("subscription %q is unknown in schema %q: it has no buckets, checkpoints or dead letters "+
		"(`kumi status` lists the subscriptions)", name, schema)
}

// asUsage makes the store's verdict on a name the user typed a usage error.
func asUsage(err error) error {
	var category *inspect.CategoryError
	if errors.Is(err, eventsource.ErrInvalidName) || errors.Is(err, eventsource.ErrInvalidCheckpoint) ||
		errors.As(err, &category) {
		return &usageError{msg: err.Error()}
	}
	return err
}
