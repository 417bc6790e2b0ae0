package observability

// ChangeKind is the kind of an ownership change; the span is named
// "kumi.lease." + kind.
type ChangeKind string

// Ownership-change kinds; docs/observability.md says what each means.
const (
	ChangeClaim          ChangeKind = "claim"
	ChangeRenewFailed    ChangeKind = "renew_failed"
	ChangeShed           ChangeKind = "shed"
	ChangeHandoffRequest ChangeKind = "handoff.request"
	ChangeHandoffGive    ChangeKind = "handoff.give"
	ChangeHandoffTake    ChangeKind = "handoff.take"
	ChangeSteal          ChangeKind = "steal"
	ChangeRelease        ChangeKind = "release"
	ChangeFenceLost      ChangeKind = "fence_lost"
)

// changeKinds lists every ownership-change kind.
var changeKinds = []ChangeKind{
	ChangeClaim, ChangeRenewFailed, ChangeShed, ChangeHandoffRequest,
	ChangeHandoffGive, ChangeHandoffTake, ChangeSteal, ChangeRelease,
	ChangeFenceLost,
}

// SpanName returns the span name of an ownership change of kind k.
func (k ChangeKind) SpanName() string { return "kumi.lease." + string(k) }

// Outcome is how a delivery ended (attribute kumi.outcome).
type Outcome string

// Delivery outcomes. Retry, panic and timeout all count as retries
// (kumi.events.retried, with the outcome as an attribute).
const (
	OutcomeAck        Outcome = "ack"         // the handler acknowledged
	OutcomeRetry      Outcome = "retry"       // the handler asked for a retry
	OutcomeDeadLetter Outcome = "dead_letter" // dead-lettered (by the handler or the retry budget)
	OutcomePanic      Outcome = "panic"       // the handler panicked (a retry)
	OutcomeTimeout    Outcome = "timeout"     // the handler did not reply in time (a retry)
	OutcomeCancelled  Outcome = "cancelled"   // the reader stopped first (lost fence, shutdown)
)

// LeaseOp names a lease-store operation (attribute kumi.operation).
type LeaseOp string

// Lease operations.
const (
	LeaseEnsure         LeaseOp = "ensure"
	LeaseRegister       LeaseOp = "register"
	LeaseHeartbeat      LeaseOp = "heartbeat"
	LeaseRenew          LeaseOp = "renew"
	LeaseClaim          LeaseOp = "claim"
	LeaseRelease        LeaseOp = "release"
	LeaseHandoffRequest LeaseOp = "handoff_request"
	LeaseHandoffGive    LeaseOp = "handoff_give"
	LeaseHandoffTake    LeaseOp = "handoff_take"
	LeaseSteal          LeaseOp = "steal"
	LeaseSnapshot       LeaseOp = "snapshot"
	LeaseGuard          LeaseOp = "guard"
)
