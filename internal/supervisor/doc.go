// Package supervisor holds the protoactor supervisor strategies kumi's
// runtime puts over its actors: [OneForOne] and [AllForOne], with a retry
// budget, backoff between restarts ([supervision.Backoff]), a [Decider]
// that maps a failure to a class and a directive, and every decision sent
// to a [supervision.Observer].
//
// It is internal: an embedding program configures supervision through
// actors.GroupOptions.Retry.Backoff (a [supervision.Backoff]) and watches it
// through actors.RuntimeOptions.Supervision (a [supervision.Observer]);
// package supervision keeps the vocabulary both sides share (error
// classes, [supervision.Classify], backoff, decisions).
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
package supervisor
