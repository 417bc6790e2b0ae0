// Command kumi is the operator's tool for kumi subscriptions: it reads and
// repairs the state the workers keep in PostgreSQL, and never joins a pool
// itself.
//
//	kumi [--database-url URL] [--schema NAME] <command>
//
//	migrate                      create or upgrade the tables (--group-size N builds a consumer-group index)
//	status [-s SUB] [-c CAT]     workers; per bucket: owner, epoch, lease expiry, pending claim, checkpoint, lag
//	dead-letters list|show|replay|discard
//	parked list|replay|discard|skip  streams parked by a dead letter (skip needs --confirm STREAM)
//	checkpoints show|reset       reset refuses while a live owner holds the bucket, unless --force
//	relinquish -s SUB --bucket B ask the bucket's owner to drain it and hand it over
//	resize -s SUB --buckets M    change the bucket count online (--cancel, --no-wait; docs/design/resize.md)
//	console [--listen ADDR]      serve the web console: bucket map, workers, dead letters, timeline (docs/console.md)
//
// The database comes from --database-url or DATABASE_URL, and is never
// printed with its password. Exit status: 0 success, 1 a runtime error (the
// database, a refusal), 2 a usage error (unknown flag, bad value, a missing
// or unparsable database URL). Every
// command has --help; docs/operations.md describes them in full.
//
// # Replaying dead letters
//
// The CLI cannot run a service's handler, so `dead-letters replay` hands each
// selected event, as JSON on stdin, to a command given with --exec, and marks
// the letter replayed when it exits 0 (eventsource.Store.ReplayDeadLetters
// does the claiming and marking). A service that wants its own handler to
// replay calls ReplayDeadLetters itself. Replay never moves a checkpoint.
//
// # Relinquish
//
// `relinquish` places a pending two-phase claim on the bucket in the name of
// a live worker other than the owner (by default the least loaded one), so
// the owner drains the bucket's reader, flushes its checkpoint and hands it
// over exactly as it would to a joining worker (leasestore.RequestHandoff).
//
// # Console
//
// `console` serves the web console (package console) on 127.0.0.1:7070 by
// default: read-only unless --allow-actions (relinquish, checkpoint reset
// and discard, with the CLI's safety rules, and replay with
// --replay-exec), an optional --token, loopback host names only on
// loopback.
package main
