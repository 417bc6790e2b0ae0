// Command demo shows kumi at work on one machine: several worker processes
// share a subscription's buckets while a producer appends, buckets move on
// a join, a graceful leave and a kill -9, the subscription is resized to
// twice its buckets while it runs, and a final check proves that every
// appended event was handled.
//
//	go run ./cmd/demo [-workers 3] [-buckets 16] [-rate 200] [-duration 60s]
//	                  [-lease row|session] [-ttl 3s] [-short] [-no-tui] [-exactly-once]
//	                  [-console 127.0.0.1:0|off]
//
// # The database
//
// Without DATABASE_URL the demo starts a throwaway PostgreSQL from the local
// server binaries (internal/pgserver) and removes it on exit, Ctrl-C included;
// -pg-port picks its port. With DATABASE_URL it works in a fresh schema
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
// ttl lapses; -lease session: at once, its session being gone). A resize
// (docs/resize.md) changes the bucket count from -buckets to twice it, and
// the next one back: the demo builds the index and requests it, as `kumi
// resize --no-wait` does, and the workers do the rest; the view's
// "buckets" line follows it (state, cut, old buckets drained, new ones
// ready), the log records each step, and the bucket map shows both
// generations' buckets ("g1/5": bucket 5 of generation 1).
//
// # The view and the check
//
// On a terminal the live view redraws in place: each worker's state,
// buckets and delivery rate; each bucket's owner, epoch, checkpoint and lag;
// the last events. It fits the terminal's height: when the full view is
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
// (observability.Setup) and the demo says where to look.
package main
