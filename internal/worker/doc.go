// Package worker is a complete kumi worker process, shared by the demo
// (cmd/demo) and the multi-process fault tests (test/integration): it joins
// a subscription group, records every delivery in an idempotent sink table
// that counts duplicates, and stops gracefully on SIGTERM or SIGINT.
//
// The sink table, sink(subscription, event_id, …, deliveries), is what the
// demo and the tests read to check that nothing was lost: one row per event
// handled, deliveries > 1 for an event handled more than once. With
// Config.Exactly the sink write and the checkpoint commit in one fenced
// transaction (actors.CommitWithCheckpoint), so deliveries stays 1 even
// across takeovers.
//
// For the fault suite, flags make the handler misbehave on purpose:
// -poison-type (panic on every attempt), -hang-type (block, deaf to the
// delivery's context, until the worker stops) and -slow-tx (an exactly-once
// transaction that outlives HandlerTimeout); -handler-timeout,
// -max-attempts, -batch-size and -overflow set the group's options.
package worker
