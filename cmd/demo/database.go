package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/dburl"
	"github.com/kumi-run/kumi/internal/pgserver"
	"github.com/kumi-run/kumi/internal/redact"
	"github.com/kumi-run/kumi/internal/worker"
	"github.com/kumi-run/kumi/leasestore"
)

// database is where the demo runs: the user's (DATABASE_URL) or a
// throwaway server of its own.
type database struct {
	url      string // given to the workers through their environment
	schema   string
	embedded *pgserver.Server
	pool     *pgxpool.Pool
	store    *eventsource.Store
	// dropSchema: the schema is the demo's own, made for this run.
	dropSchema bool
	// describe says where the data lives, without a password.
	describe string
	// pgpass is a password file of the embedded server's, for the kumi
	// command the demo prints (PGPASSFILE); "" with DATABASE_URL.
	pgpass string
}

// openDatabase connects to DATABASE_URL, or starts the embedded server.
// Its errors say what to do and never repeat a password.
func openDatabase(ctx context.Context, cfg config) (*database, error) {
	db := &database{}
	if url := os.Getenv("DATABASE_URL"); url != "" {
		if cfg.pgPort != 0 {
			return nil, errors.New("-pg-port is for the embedded PostgreSQL, but DATABASE_URL is set")
		}
		db.url = url
		db.schema = cfg.schema
		if db.schema == "" {
			var b [3]byte
			_, _ = rand.Read(b[:])
			db.schema = "kumi_demo_" + hex.EncodeToString(b[:])
			db.dropSchema = !cfg.keep
		}
		db.describe = fmt.Sprintf("DATABASE_URL, schema %q", db.schema)
		if db.dropSchema {
			db.describe += " (dropped on exit)"
		}
	} else {
		if cfg.schema != "" || cfg.keep {
			return nil, errors.New("-schema and -keep are for DATABASE_URL; the embedded PostgreSQL is removed on exit")
		}
		if err := portFree(cfg.pgPort); err != nil {
			return nil, err
		}
		// A password, not trust: while the demo runs, any local process
		// could otherwise connect as the superuser.
		var pw [18]byte
		_, _ = rand.Read(pw[:])
		password := hex.EncodeToString(pw[:])
		s, err := pgserver.Start(ctx, pgserver.Options{Port: cfg.pgPort, MaxConnections: 200, Password: password})
		if err != nil {
			if cfg.pgPort != 0 && strings.Contains(err.Error(), "could not create any TCP/IP sockets") {
				// Taken between the check above and the server's start.
				return nil, portInUse(cfg.pgPort)
			}
			return nil, fmt.Errorf("start the embedded PostgreSQL: %w", err)
		}
		db.embedded, db.url, db.schema = s, s.URL, eventsource.SchemaDefault
		if db.pgpass, err = writePgpass(s.Port(), password); err != nil {
			db.close()
			return nil, err
		}
		db.describe = fmt.Sprintf("embedded PostgreSQL %s (removed on exit)", redact.URL(s.URL))
	}
	pool, err := dburl.Connect(ctx, db.url, 6, "kumi demo")
	if err != nil {
		db.close()
		if db.embedded == nil {
			return nil, fmt.Errorf("DATABASE_URL: %w", err)
		}
		return nil, err
	}
	db.pool = pool
	if db.store, err = eventsource.New(pool, eventsource.Config{Schema: db.schema}); err != nil {
		db.close()
		return nil, fmt.Errorf("-schema: %w", err)
	}
	if err := db.migrate(ctx); err != nil {
		db.close()
		return nil, err
	}
	return db, nil
}

// migrate creates the tables before the workers start (they would, too)
// and the sink the workers record deliveries in.
func (db *database) migrate(ctx context.Context) error {
	if err := db.store.Migrate(ctx); err != nil {
		return fmt.Errorf("migrate the event store: %w", err)
	}
	if err := leasestore.Migrate(ctx, db.pool, db.schema); err != nil {
		return fmt.Errorf("migrate the lease store: %w", err)
	}
	if _, err := db.pool.Exec(ctx, worker.SinkDDL(db.schema)); err != nil {
		return fmt.Errorf("create the sink table: %w", err)
	}
	return nil
}

// close drops the demo's own schema and stops the embedded server.
func (db *database) close() {
	if db.pool != nil {
		if db.dropSchema {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, _ = db.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{db.schema}.Sanitize()+" CASCADE")
			cancel()
		}
		db.pool.Close()
	}
	if db.embedded != nil {
		db.embedded.Stop()
	}
	if db.pgpass != "" {
		_ = os.Remove(db.pgpass)
	}
}

// writePgpass writes a password file (PGPASSFILE) for the embedded
// server, readable by the user only, and returns its path.
func writePgpass(port int, password string) (string, error) {
	f, err := os.CreateTemp("", "kumi-demo-pgpass-")
	if err != nil {
		return "", fmt.Errorf("write the password file: %w", err)
	}
	_, err = fmt.Fprintf(f, "127.0.0.1:%d:*:postgres:%s\n", port, password)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return "", fmt.Errorf("write the password file: %w", err)
	}
	return f.Name(), nil
}

// portFree checks that the embedded server's port can be bound (0 is
// always fine: a free one is picked).
func portFree(port int) error {
	if port == 0 {
		return nil
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return portInUse(port)
	}
	return ln.Close()
}

func portInUse(port int) error {
	return fmt.Errorf("start the embedded PostgreSQL: port %d is in use on 127.0.0.1: "+
		"pass another -pg-port (-pg-port 0 picks a free one), or set DATABASE_URL to use a running server", port)
}

// kumiCommand is how to look at this run with the operator CLI: for the
// embedded server, its URL without the password, which the password file
// supplies (PGPASSFILE), so that the line can be copied as it is.
func (db *database) kumiCommand(subscription, category string) string {
	schema := ""
	if db.schema != eventsource.SchemaDefault {
		schema = " --schema " + db.schema
	}
	prefix := ""
	if db.embedded != nil {
		prefix = fmt.Sprintf("PGPASSFILE=%s DATABASE_URL='postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable' ",
			db.pgpass, db.embedded.Port())
	}
	return fmt.Sprintf("%sgo run ./cmd/kumi%s status -s %s -c %s", prefix, schema, subscription, category)
}
