// Command demo shows kumi at work on one machine: several worker processes
// share a subscription's buckets while a producer appends, buckets move on
// a join, an online resize, a graceful leave and a kill -9, and a final
// check proves that every appended event was handled.
//
//	go run ./cmd/demo [-workers 3] [-buckets 16] [-rate 200] [-duration 60s]
//	                  [-lease row|session] [-ttl 3s] [-short] [-no-tui] [-exactly-once]
//	                  [-console 127.0.0.1:0|off]
//
// # The database
//
// Without DATABASE_URL the demo starts a throwaway PostgreSQL from the local
// server binaries (internal/pgserver) and removes it on exit, Ctrl-C included;
// -pg-port picks its port. It listens on 127.0.0.1 and its socket
// directory is its own, and every connection must give the postgres
// role's password (scram-sha-256), generated for the run: the demo prints
// the URL with it masked, and its inspect line reads it from a password
// file of the user's (PGPASSFILE), removed on exit. With DATABASE_URL it works in a fresh schema
// kumi_demo_<random> of that database and drops it on exit (-keep keeps it,
// -schema names one to use and keep). Errors name the missing binaries, the
// port in use or the unusable URL, never its password.
//
// # The workers
//
// The demo starts its own binary again with the "worker" subcommand for
// each worker (internal/worker: a real process that joins the group and
// records each delivery in an idempotent sink table counting duplicates).
// The database URL reaches them through the environment, not the command
// line. A join starts one more; a graceful leave sends SIGTERM (the worker
// finishes its in-flight events, flushes its checkpoints and releases its
// leases, so the others take over at once); a kill sends SIGKILL to the
// worker owning the most buckets (row leases: its buckets move when their
// ttl lapses; -lease session: at once, its session being gone).
//
// # The resize
//
// A resize changes the subscription's bucket count while the workers run
// (docs/design/resize.md), alternating between -buckets and twice that: the demo
// builds the consumer-group index for the new count and requests it
// (actors.Resize, as `kumi resize --no-wait` does), and the workers do the
// rest — the old buckets' holders agree on a cut, drain to it, and each new
// bucket starts once the old buckets feeding it have drained. The scripted
// run resizes between the join and the graceful leave, so the leave and the
// kill land during or after it; the final check covers it (nothing lost,
// and with -exactly-once no duplicate).
//
// # The view and the check
//
// On a terminal the live view redraws in place: each worker's state,
// buckets and delivery rate; each bucket's owner, epoch, checkpoint and lag;
// the last events; during a resize its state (generation, cut, drained and
// ready counts) and both generations' bucket maps, an old bucket drained
// to the cut marked ∎ and a new one standing by marked …. It fits the
// terminal's height: when the full view is
// too tall it shows the bucket map compact (owner per bucket), hides
// stopped workers and older events, and its last line says what it hid.
// With -no-tui (or when stdout is not a terminal) it
// prints log lines instead. Keys: a add a worker, l stop one gracefully, k
// kill -9 the busiest, r resize, q finish; stdin goes to raw mode only when it is a
// terminal. At the end the producer stops, the demo waits until every
// event is in the sink, stops the workers gracefully and prints the check:
// appended against distinct events handled. Ctrl-C, SIGTERM and SIGHUP
// (the terminal closing) finish the run the same way, outcome line
// included; a second Ctrl-C or SIGTERM aborts (workers killed, no check),
// and either way the workers stop and the embedded server's directory is
// removed. Should the demo itself be killed, its workers get SIGTERM from
// the kernel (Pdeathsig) and stop. The exit status is 0 when
// nothing was lost, 1 when something was (or the demo could not run), 2 for
// bad flags, 130 when aborted by a second Ctrl-C.
//
// # The web console
//
// The demo serves the web console (package console, read-only) on a free
// loopback port and prints its address for the demo's subscription among
// its first lines (plain mode) or at the head of the live view's database
// line: the bucket map, workers, dead letters and ownership timeline of the
// run, updated every second. -console HOST:PORT serves it elsewhere,
// -console off not at all.
//
// With OTEL_EXPORTER_OTLP_ENDPOINT set the workers export their traces
// (otelsetup.Setup) and the demo says where to look.
package main
