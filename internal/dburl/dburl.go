// Package dburl turns a connection string into a pool without ever
// repeating its password: [Parse] describes a string that does not parse
// in words of its own, [Connect] opens and checks a pool, and
// [RedactError] masks a driver's message. kumi's CLI, console, demo and
// worker connect through it.
package dburl

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/redact"
)

// Every message kumi prints about a connection string goes through this
// file. Two rules keep passwords out of them:
//
//   - a connection string that does not parse is described from a fixed
//     vocabulary ([Parse]): neither the parser's message nor any part of
//     the string is repeated, since a broken string has no reliable
//     password boundary (a '/' in a password makes the rest of it a
//     "port", a '%zz' makes it an "escape");
//   - any other message (a failed connection, a driver error) is passed
//     through [redact.Conn] with the string it came from, which masks URL and
//     key=value passwords and every piece of what looks like the
//     string's password, however the parser split it (internal/redact).

// RedactError is err with its message passed through [redact.Conn]; nil for
// nil. It keeps no chain: the wrapped errors still hold the password.
func RedactError(conn string, err error) error {
	if err == nil {
		return nil
	}
	return errors.New(redact.Conn(conn, err.Error()))
}

// Error reports a connection string that is missing or does not
// parse: a bad value, not a database that failed. Its message never
// repeats the string (which may hold a password).
type Error struct{ msg string }

// Error says what is wrong and what a connection string looks like.
func (e *Error) Error() string { return e.msg }

// ConfigError reports true: the error is a supervision.ConfigMarker, so
// supervision classifies it as invalid configuration.
func (e *Error) ConfigError() bool { return true }

// Parse parses a connection string as pgxpool does; its error is a
// *Error.
func Parse(url string) (*pgxpool.Config, error) {
	if url == "" {
		return nil, &Error{"no database: set DATABASE_URL or pass --database-url"}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &Error{redact.Conn(url, fmt.Sprintf("the database URL is not a valid PostgreSQL connection string (%s); "+
			"expected postgres://USER@HOST:PORT/DBNAME?sslmode=disable (with :PASSWORD after USER if needed, "+
			"its '/', '@', ':' and '%%' written %%2F, %%40, %%3A and %%25) or key=value pairs",
			parseProblem(url, err)))}
	}
	return cfg, nil
}

// parseProblems maps what pgx's parser says (after its "cannot parse
// `…`: ") to what kumi says. Only the key is matched, as a prefix or a
// part: the text kumi prints is always the value, so nothing of the
// string, which pgx's messages quote, gets through.
var parseProblems = []struct{ key, say string }{
	{"forbidden NUL byte", "it holds a NUL byte"},
	{`looking for matching "]"`, "an IPv6 host lacks its closing ']'"},
	{"IPv6 host address may not be empty", "an IPv6 host is empty"},
	{"unexpected character", "an unexpected character follows an IPv6 host"},
	{"missing key/value separator", "a query parameter has no '=' (write ?key=value&key=value)"},
	{"extra key/value separator", "a query parameter has more than one '='"},
	{"invalid percent-encoded token", "a '%' is not followed by two hex digits (write a literal '%' as %25)"},
	{"forbidden value %00", "it holds %00"},
	{"unexpected spaces found", "a part of the URL holds a space (write it as %20)"},
	{"invalid keyword/value", kvWord},
	{`missing "=" after`, kvWord},
	{"unterminated quoted string", "a quoted value is not closed"},
	{"is not in ConnStringAllowedKeys", "a key is not allowed"},
	{"failed to read service", "its service file cannot be read"},
	{"invalid sslcertmode", "sslcertmode is not valid"},
	{"invalid connect_timeout", "connect_timeout is not a number of seconds"},
	{"could not match", "its hosts and ports are not as many"},
	{"invalid port", "the port is not a number from 1 to 65535 " +
		"(in a URL, a '/' in the password ends the host part: write it %2F)"},
	{"failed to configure TLS", "its TLS settings are not valid (sslmode, sslcert, sslkey, sslrootcert)"},
	{"unknown target_session_attrs value", "target_session_attrs is not valid"},
	{"invalid min_protocol_version", "min_protocol_version is not valid"},
	{"invalid max_protocol_version", "max_protocol_version is not valid"},
	{"min_protocol_version cannot be greater", "min_protocol_version is above max_protocol_version"},
	{"unknown channel_binding value", "channel_binding is not valid"},
	{"invalid require_auth", "require_auth is not valid"},
	{"cannot parse pool_", "a pool_ setting is not valid"},
	{"pool_max_conns too small", "pool_max_conns is below 1"},
}

const kvWord = "a word has no '=' or no value (quote a value holding spaces: password='a b')"

// parseProblem says what is wrong with a connection string that does not
// parse, in words of its own: url.Parse's and pgconn's messages repeat the
// string, and pgconn's redaction cannot find a password in a broken one.
func parseProblem(conn string, err error) string {
	reason := err.Error()
	if i := strings.LastIndex(reason, "`: "); i >= 0 {
		reason = reason[i+3:]
	}
	// The outer message ("failed to parse as URL") says less than the one
	// it wraps (in parentheses): try the latter first.
	for _, p := range parseProblems {
		if _, inner, ok := strings.Cut(reason, " ("); ok && strings.Contains(inner, p.key) {
			return p.say
		}
	}
	for _, p := range parseProblems {
		if strings.Contains(reason, p.key) {
			return p.say
		}
	}
	if _, ok := redact.CutScheme(conn); ok {
		return "it does not parse as a URL"
	}
	return "it does not parse as key=value pairs"
}

// Connect opens a pool on a connection string and checks that the
// database answers. Its errors never repeat a password: a URL that does
// not parse is reported without the parser's message (which quotes it),
// and a failed connection is redacted. app, when the URL sets none, is the
// connections' application_name: the ownership record names who made a
// change by it (leasestore.OwnershipChange.Application).
func Connect(ctx context.Context, url string, maxConns int32, app string) (*pgxpool.Pool, error) {
	cfg, err := Parse(url)
	if err != nil {
		return nil, err
	}
	if _, set := cfg.ConnConfig.RuntimeParams["application_name"]; !set && app != "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = app
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, RedactError(url, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to the database: %s", connectProblem(url, err))
	}
	return pool, nil
}

// connectProblem is a failed connection's message, redacted, with each
// attempt said once: pgconn lists every attempt, and with sslmode=prefer
// (the default) the first is a TLS attempt whose "server refused TLS
// connection" only says that the server has no TLS, after which the plain
// attempt's error is the one that matters.
func connectProblem(conn string, err error) string {
	parts := strings.Split(redact.Conn(conn, err.Error()), "\n\t")
	head, attempts := parts[0], parts[1:]
	var kept []string
	for _, a := range attempts {
		if strings.HasSuffix(a, "tls error: server refused TLS connection") && len(attempts) > 1 {
			continue
		}
		if !slices.Contains(kept, a) {
			kept = append(kept, a)
		}
	}
	switch len(kept) {
	case 0:
		return head
	case 1:
		return head + " " + kept[0]
	}
	return head + "\n\t" + strings.Join(kept, "\n\t")
}
