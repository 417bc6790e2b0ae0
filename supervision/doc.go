// Package supervision decides what happens to kumi's actors when they fail:
// error classes, a decider, exponential backoff with jitter, and
// protoactor supervisor strategies with a retry budget whose every decision
// can be observed.
//
// A protoactor actor fails by panicking. Its mailbox is suspended and its
// parent's [actor.SupervisorStrategy] decides: resume, restart, stop, or
// escalate to the grandparent. kumi's [Strategy] makes that decision from
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
// A [Decider] maps a failure reason (the panic value) to a class and an
// [actor.Directive]. [DefaultDecider] uses [Classify] and [DirectiveFor];
// write your own to override a case and defer to it for the rest.
//
// # Backoff
//
// [Backoff] waits at most min(Max, Initial·Multiplierⁿ⁻¹) before attempt n,
// randomised by full (the default) or equal jitter. Its random source can
// be injected for tests. Other packages may use it for their own retries
// (reconnects, handler retries) and check it with [Backoff.Validate].
//
// # Strategies
//
// [OneForOne] applies each decision to the failed child; [AllForOne]
// applies it to every child of the supervisor. Each child has a retry
// budget: [Options.MaxRestarts] restarts within a sliding
// [Options.Window]; the failure after that stops the child (under
// all-for-one, every child) or, with [EscalateWhenExhausted], escalates.
// A child that reports a success ([Strategy.Succeeded]) starts over: its
// next failure is a first one, with the first backoff and the whole budget.
// A restart waits its backoff on a timer: the supervisor's mailbox is not
// blocked, the failed child stays suspended, and [Strategy.Close] cancels
// what is still pending. Failures of siblings while an all-for-one restart
// waits join it.
//
// Supervise an actor's children with actor.WithSupervisor(strategy), and a
// top-level actor — which protoactor otherwise hands to its own default
// strategy — with actor.WithGuardian(strategy). A guardian has no parent
// to escalate to and does not know its children, so under a guardian
// Escalate becomes Stop and all-for-one acts on the failed actor alone.
//
// # Observing decisions
//
// Every decision reaches the [Observer] of [Options] as a [Decision] —
// child, class, directive, attempt, delay, exhaustion, reason — before it
// is carried out, and is published on the actor system's event stream as
// an [actor.SupervisorEvent]. The default observer, [LogObserver], logs at
// Debug; [Observers] fans out to several, for logs, metrics and traces.
package supervision
