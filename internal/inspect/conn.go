package inspect

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ConnectPool opens a pool on a connection string and checks that the
// database answers. Its errors never repeat a password: a URL that does
// not parse is reported without the parser's message (which quotes it),
// and a failed connection is redacted.
func ConnectPool(ctx context.Context, url string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, redact(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot connect to the database: %s", connectProblem(err))
	}
	return pool, nil
}

// URLError reports a connection string that is missing or does not
// parse: a bad value, not a database that failed. Its message never
// repeats the string (which may hold a password).
type URLError struct{ msg string }

// Error says what is wrong and what a connection string looks like.
func (e *URLError) Error() string { return e.msg }

// ParseURL parses a connection string as pgxpool does; its error is a
// *URLError.
func ParseURL(url string) (*pgxpool.Config, error) {
	if url == "" {
		return nil, &URLError{"no database: set DATABASE_URL or pass --database-url"}
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, &URLError{fmt.Sprintf("the database URL is not a valid PostgreSQL connection string (%s); "+
			"expected postgres://USER@HOST:PORT/DBNAME?sslmode=disable (with :PASSWORD after USER if needed) or key=value pairs",
			parseProblem(url, err))}
	}
	return cfg, nil
}

// connectProblem is a failed connection's message, redacted, with each
// attempt said once: pgconn lists every attempt, and with sslmode=prefer
// (the default) the first is a TLS attempt whose "server refused TLS
// connection" only says that the server has no TLS, after which the plain
// attempt's error is the one that matters.
func connectProblem(err error) string {
	parts := strings.Split(RedactURL(err.Error()), "\n\t")
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

// parseProblem says what is wrong with a connection string that does not
// parse, without quoting it: url.Parse's and pgconn's messages repeat the
// string, password included.
func parseProblem(conn string, err error) string {
	if strings.HasPrefix(conn, "postgres://") || strings.HasPrefix(conn, "postgresql://") {
		var ue *neturl.Error
		if _, perr := neturl.Parse(conn); errors.As(perr, &ue) {
			return RedactURL(ue.Err.Error())
		}
	}
	msg := err.Error()
	// pgconn: "cannot parse `<redacted string>`: <reason>".
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		msg = msg[i+3:]
	}
	return RedactURL(msg)
}

// redact is err with every password of a connection string replaced.
func redact(err error) error { return errors.New(RedactURL(err.Error())) }
