// Package supervision decides what happens to kumi's actors when they fail:
// error classes, a decider, exponential backoff with jitter, and
// protoactor supervisor strategies with a retry budget whose every decision
// can be observed.
//
// A protoactor actor fails by panicking. Its mailbox is suspended and its
// parent's [actor.SupervisorStrategy] decides: resume, restart, stop, or
// escalate to the grandparent. kumi's supervisor strategy makes that decision from
// the kind of error, spaces restarts out with real exponential backoff, and
// gives up after a budget.
//
// # Error classes
//
// [Classify] sorts an error into a [Class]:
//
//   - [Transient] — a dropped connection, serialization failure, deadlock,
//     server restart, resource shortage or timeout: restart, with backoff;
//   - [FenceLost] — the error wraps [eventsource.ErrFenceLost], the worker
//     lost the bucket: stop at once, never restart;
//   - [Config] — invalid configuration, missing schema or tables, refused
//     credentials: escalate, since a restart fails the same way;
//   - [Permanent] — marked as such: stop;
//   - [Unknown] — anything else: restart, with backoff.
//
// Any package can classify its own errors without importing this one, by
// giving them a ConfigError, PermanentError or TransientError method that
// returns true ([ConfigMarker], [PermanentMarker], [TransientMarker]).
// An invalid field of this package's own options is a
// [*kumierr.ConfigError] naming it, as in every kumi package.
//
// # Deciding
//
// kumi's supervisor strategies (internal) turn a class into a directive:
// Stop for [FenceLost] and [Permanent], Escalate for [Config], Restart with
// backoff for [Transient] and [Unknown], within a retry budget per child.
//
// # Backoff
//
// [Backoff] waits at most min(Max, Initial·Multiplierⁿ⁻¹) before attempt n,
// randomised by full (the default) or equal jitter. Its random source can
// be injected for tests. Other packages may use it for their own retries
// (reconnects, handler retries) and check it with [Backoff.Validate].
//
// # Observing decisions
//
// Every decision reaches the runtime's [Observer]
// (actors.RuntimeOptions.Supervision) as a [Decision] —
// child, class, directive, attempt, delay, exhaustion, reason — before it
// is carried out, and is published on the actor system's event stream as
// an [actor.SupervisorEvent]. The default observer, [LogObserver], logs at
// Debug; [Observers] fans out to several, for logs, metrics and traces.
package supervision
