// Package pgserver runs a throwaway PostgreSQL: the embedded database of
// the demo (cmd/demo) and of the tests (through internal/pgtest).
//
// [Start] initialises a data directory in a temp dir with the locally
// installed server binaries (on PATH, or the newest
// /usr/lib/postgresql/*/bin), starts postgres on a loopback port (a free
// one unless [Options.Port] says) and waits until it accepts connections.
// As root, the server runs as the "postgres" user. It follows its parent
// when the parent dies. [Server.Stop] removes it, data and all;
// [Server.Restart] cuts every session and starts it again on the same
// port and data.
//
// [Server.StartReplica] starts a real streaming hot standby of a server
// (pg_basebackup, a replication slot of its own), and [Server.StartBouncer]
// a real PgBouncer in front of it in session or transaction mode; package
// pgtest wraps both for tests (NewReplica, NewBouncer), and its doc says
// how they are used.
package pgserver
