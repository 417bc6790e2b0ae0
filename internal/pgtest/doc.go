// Package pgtest runs a throwaway PostgreSQL for tests and benchmarks, and
// gives each test a fresh schema of its own.
//
// # The server
//
// The server itself is [pgserver]'s (the demo embeds it too); [Start],
// [Server], [Options], [FindBinaries] and [FreePort] are its, here for
// tests that need a server of their own.
//
// # Replicas
//
// [Server.StartReplica] (or [NewReplica] in a test, of [LocalServer]: the
// throwaway server, or one of the test's own under DATABASE_URL) copies a
// running server with pg_basebackup and starts the copy as a hot standby
// streaming from it through a replication slot of its own, so the primary
// keeps the WAL a paused or stopped standby still needs. [Replica.PauseReplay] and
// [Replica.ResumeReplay] hold its snapshot back on demand,
// [Replica.WaitReplayed] waits until it has replayed everything committed
// so far, [Replica.Lag] reads how far behind it is, and Restart and
// [Replica.Promote] do what they say; [Replica.Detach] cuts it off from
// its primary first, to play a failover that loses the primary's latest
// commits. [StartAutoFailover] runs a pg_auto_failover formation instead
// (a monitor and two nodes, each under its pg_autoctl keeper), whose
// monitor promotes the standby as a real HA manager does: on a planned
// [AutoFailover.PerformFailover], or when [AutoFailover.KillPrimary] kills
// the primary's machine.
//
// # PgBouncer
//
// [Server.StartBouncer] (or [NewBouncer] in a test) starts the installed
// pgbouncer (Debian's package: 1.18) in front of a server, in session or
// transaction mode, on a free loopback port, with its ini and auth file in a
// temp dir. In transaction mode its URL sets
// default_query_exec_mode=[BouncerExecMode], the setting kumi documents for
// PgBouncer before 1.21.
//
// # In tests
//
// Call [Main] from a package's TestMain: it starts one server per test binary
// (or uses DATABASE_URL when set), runs the tests, checks for leaked
// goroutines with goleak and stops the server. [NewSchema] then gives a test
// a fresh schema name, dropped when the test ends, so tests run in parallel
// without sharing rows. [Eventually] polls a condition with a deadline, for
// tests that must wait on something asynchronous without sleeping blindly.
package pgtest
