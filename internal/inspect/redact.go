package inspect

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/internal/redact"
)

// Every message kumi prints about a connection string goes through this
// file. Two rules keep passwords out of them:
//
//   - a connection string that does not parse is described from a fixed
//     vocabulary ([ParseURL]): neither the parser's message nor any part of
//     the string is repeated, since a broken string has no reliable
//     password boundary (a '/' in a password makes the rest of it a
//     "port", a '%zz' makes it an "escape");
//   - any other message (a failed connection, a driver error) is passed
//     through [Redact] with the string it came from, which masks URL and
//     key=value passwords and every piece of what looks like the
//     string's password, however the parser split it (internal/redact).

// RedactURL replaces passwords in connection strings within s by "xxxxx".
func RedactURL(s string) string { return redact.URL(s) }

// Redact masks, in msg, the passwords of connection strings (as
// [RedactURL]) and every piece of conn's password: the whole of it, and
// each part between the separators a parser may have split it at (so a
// password "ab/cdef@host" whose "cdef" became a host name is masked there
// too). Pieces shorter than four characters are left, as they cannot be
// told from the message's own words.
func Redact(conn, msg string) string { return redact.Conn(conn, msg) }

// RedactError is err with its message passed through [Redact]; nil for
// nil. It keeps no chain: the wrapped errors still hold the password.
func RedactError(conn string, err error) error {
	if err == nil {
		return nil
	}
	return errors.New(Redact(conn, err.Error()))
}

// URLError reports a connection string that is missing or does not
// parse: a bad value, not a database that failed. Its message never
// repeats the string (which may hold a password).
type URLError struct{ msg string }

// Error says what is wrong and what a connection string looks like.
func (e *URLError) Error() string { return e.msg }

// ConfigError reports true: the error is a supervision.ConfigMarker, so
// supervision classifies it as invalid configuration.
func (e *URLError) ConfigError() bool { return true }

// ParseURL parses a connection string as pgxpool does; its error is a
// *URLError.
func ParseURL(url string) (*pgxpool.Config, error) {
	if url == "" {
		return nil, &URLError{"no database: set DATABASE_URL or pass --database-url"}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &URLError{Redact(url, fmt.Sprintf("the database URL is not a valid PostgreSQL connection string (%s); "+
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
