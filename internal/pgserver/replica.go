package pgserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Replica is a hot standby of a [Server] on the same machine, streaming its
// WAL over a physical replication slot of its own (so the primary keeps
// every segment the standby has not received: it never falls off however
// long it is paused or stopped). It is started by [Server.StartReplica] and
// removed, slot and all, by [Replica.Stop]. Its embedded Server's URL,
// Port and Restart address the standby.
type Replica struct {
	*Server
	primary *Server
	slot    string
}

// StartReplica takes a base backup of s (pg_basebackup as the server's
// user, streaming the WAL it needs, through a new replication slot), starts
// it as a hot standby on a free loopback port and waits until it accepts
// connections and has replayed everything s had written when it was
// called.
func (s *Server) StartReplica(ctx context.Context) (*Replica, error) {
	if _, ok := s.user.Password(); ok {
		return nil, errors.New("pgtest: a replica needs a primary that trusts local connections (no Options.Password)")
	}
	port, err := FreePort()
	if err != nil {
		return nil, fmt.Errorf("pgtest: find a free port: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	r := &Replica{
		Server:  &Server{binDir: s.binDir, port: port},
		primary: s,
		slot:    "kumi_replica_" + hex.EncodeToString(b[:]),
	}
	if r.dir, r.cred, err = ownedTempDir("kumi-pg-replica-"); err != nil {
		return nil, err
	}
	r.dataDir = filepath.Join(r.dir, "data")
	// -R writes standby.signal and primary_conninfo; -C -S creates the
	// slot and names it in primary_slot_name; -X stream copies the WAL
	// written during the backup.
	backup := exec.CommandContext(ctx, filepath.Join(s.binDir, "pg_basebackup"),
		"-D", r.dataDir, "-h", "127.0.0.1", "-p", fmt.Sprint(s.port), "-U", "postgres",
		"-R", "-C", "-S", r.slot, "-X", "stream", "-c", "fast", "--no-sync")
	backup.SysProcAttr = &syscall.SysProcAttr{Credential: r.cred}
	backup.Dir = r.dir
	if out, err := backup.CombinedOutput(); err != nil {
		_ = os.RemoveAll(r.dir)
		r.dropSlot()
		return nil, fmt.Errorf("pgtest: pg_basebackup: %w\n%s", err, out)
	}
	// The copied postgresql.conf is the primary's; these lines override it.
	// max_connections and max_locks_per_transaction stay the primary's (a
	// hot standby needs at least as many).
	conf := []string{
		fmt.Sprintf("port = %d", port),
		fmt.Sprintf("unix_socket_directories = '%s'", r.dir),
		"shared_buffers = 32MB",
		"hot_standby = on",
		// Replay never waits for (or cancels) a standby query: tests pause
		// replay explicitly when they want it behind.
		"max_standby_streaming_delay = -1",
		"wal_receiver_status_interval = 1s",
	}
	if err := appendConf(r.dataDir, conf); err != nil {
		r.cleanup()
		return nil, err
	}
	r.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	if err := r.launch(ctx); err != nil {
		r.cleanup()
		return nil, err
	}
	if err := r.WaitReplayed(ctx); err != nil {
		r.Stop()
		return nil, err
	}
	return r, nil
}

func (r *Replica) cleanup() {
	_ = os.RemoveAll(r.dir)
	r.dropSlot()
}

// dropSlot removes the replica's slot from the primary, so that it stops
// retaining WAL.
func (r *Replica) dropSlot() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, r.primary.URL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	_, _ = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", r.slot)
}

// Stop shuts the standby down, removes its directory and drops its slot.
func (r *Replica) Stop() {
	r.kill()
	r.cleanup()
}

// query runs one single-row statement on url over a connection of its own.
func query(ctx context.Context, url, sql string, args []any, dest ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// Lag is how far a standby is behind its primary.
type Lag struct {
	// Bytes of WAL the primary has written that the standby has not
	// replayed.
	Bytes int64
	// Replayed is the commit time of the last transaction the standby
	// replayed (pg_last_xact_replay_timestamp); zero before the first.
	Replayed time.Time
	// Paused reports whether replay is paused (or pausing).
	Paused bool
}

// Lag reads how far the standby is behind the primary now.
func (r *Replica) Lag(ctx context.Context) (Lag, error) {
	var primaryLSN string
	if err := query(ctx, r.primary.URL, "SELECT pg_current_wal_lsn()::text", nil, &primaryLSN); err != nil {
		return Lag{}, fmt.Errorf("pgtest: read the primary's WAL position: %w", err)
	}
	var lag Lag
	var replayed *time.Time
	err := query(ctx, r.URL, `SELECT greatest(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 0)::bigint,
		pg_last_xact_replay_timestamp(), pg_get_wal_replay_pause_state() <> 'not paused'`,
		[]any{primaryLSN}, &lag.Bytes, &replayed, &lag.Paused)
	if err != nil {
		return Lag{}, fmt.Errorf("pgtest: read the standby's replay position: %w", err)
	}
	if replayed != nil {
		lag.Replayed = *replayed
	}
	return lag, nil
}

// flushedLSN commits a transaction with synchronous_commit on — the test
// server commits asynchronously, and a standby receives only flushed WAL —
// and returns the WAL position flushed with it: every transaction committed
// on the server before the call is at or before it.
func (s *Server) flushedLSN(ctx context.Context) (string, error) {
	conn, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		return "", fmt.Errorf("pgtest: connect to the primary: %w", err)
	}
	defer conn.Close(context.Background())
	var lsn string
	if _, err = conn.Exec(ctx, "SET synchronous_commit = on"); err == nil {
		// A transaction that writes WAL (a logical message: no table) is
		// one whose commit flushes; one that only takes an xid is not.
		if _, err = conn.Exec(ctx, "SELECT pg_logical_emit_message(true, 'pgtest', '')"); err == nil {
			err = conn.QueryRow(ctx, "SELECT pg_current_wal_flush_lsn()::text").Scan(&lsn)
		}
	}
	if err != nil {
		return "", fmt.Errorf("pgtest: flush the primary's WAL: %w", err)
	}
	return lsn, nil
}

// WaitReplayed waits until the standby has replayed all the WAL the primary
// had committed when it was called (at most a minute, or until ctx ends). It
// fails at once when replay is paused: it would never happen.
func (r *Replica) WaitReplayed(ctx context.Context) error {
	target, err := r.primary.flushedLSN(ctx)
	if err != nil {
		return err
	}
	var behind int64
	var paused bool
	WaitFor(time.Minute, func() bool {
		err = query(ctx, r.URL, `SELECT coalesce(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_replay_lsn()), 1)::bigint,
			pg_get_wal_replay_pause_state() <> 'not paused'`, []any{target}, &behind, &paused)
		return (err == nil && (behind <= 0 || paused)) || ctx.Err() != nil
	})
	switch {
	case err == nil && behind <= 0:
		return nil
	case err == nil && paused:
		return ErrReplayPaused
	}
	return fmt.Errorf("pgtest: the standby did not replay up to %s within a minute (%d bytes behind; last error: %v)",
		target, behind, err)
}

// ErrReplayPaused is returned by [Replica.WaitReplayed] when replay is
// paused and so will not catch up.
var ErrReplayPaused = errors.New("pgserver: the standby's replay is paused; resume it first")

// PauseReplay stops the standby applying WAL (pg_wal_replay_pause) and
// waits until it has stopped: from its return until [Replica.ResumeReplay]
// the standby's snapshot shows nothing newer. It keeps receiving WAL.
func (r *Replica) PauseReplay(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, r.URL)
	if err != nil {
		return fmt.Errorf("pgtest: connect to the standby: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT pg_wal_replay_pause()"); err != nil {
		return fmt.Errorf("pgtest: pause replay: %w", err)
	}
	var state string
	if !WaitFor(time.Minute, func() bool {
		err = conn.QueryRow(ctx, "SELECT pg_get_wal_replay_pause_state()").Scan(&state)
		return err != nil || state == "paused"
	}) || err != nil {
		return fmt.Errorf("pgtest: replay did not pause (state %q, error %v)", state, err)
	}
	return nil
}

// ResumeReplay lets a paused standby apply WAL again.
func (r *Replica) ResumeReplay(ctx context.Context) error {
	var ignored string
	if err := query(ctx, r.URL, "SELECT pg_wal_replay_resume()::text", nil, &ignored); err != nil {
		return fmt.Errorf("pgtest: resume replay: %w", err)
	}
	return nil
}

// Detach restarts the standby without its connection to the primary, as a
// standby cut off from a failed primary: it replays the WAL it has already
// received and nothing the primary writes from now on. Promote it to play
// a failover that loses the primary's latest commits.
func (r *Replica) Detach(ctx context.Context) error {
	r.kill()
	f, err := os.OpenFile(filepath.Join(r.dataDir, "postgresql.auto.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("pgtest: open postgresql.auto.conf: %w", err)
	}
	_, err = f.WriteString("\nprimary_conninfo = ''\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgtest: write postgresql.auto.conf: %w", err)
	}
	return r.launch(ctx)
}

// Promote makes the standby a primary (pg_promote, waiting until it is
// one). It no longer follows the server it was copied from.
func (r *Replica) Promote(ctx context.Context) error {
	var promoted bool
	if err := query(ctx, r.URL, "SELECT pg_promote(true, 60)", nil, &promoted); err != nil {
		return fmt.Errorf("pgtest: promote: %w", err)
	}
	if !promoted {
		return errors.New("pgserver: the standby was not promoted within a minute")
	}
	return nil
}
