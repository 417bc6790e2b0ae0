package obsname

// Every name kumi emits — span names, attribute keys, metric names and units —
// is a constant here, under one prefix, "kumi.", except the OpenTelemetry
// messaging semantic conventions ("messaging.*"), used where they fit. The
// list is reproduced in docs/observability.md; a test keeps the two in step.

// ScopeName is the instrumentation scope of kumi's tracer and meter (the
// otel.scope.name tag in Jaeger, the otel_scope_name label in Prometheus).
const ScopeName = "github.com/kumi-run/kumi"

// Span names.
const (
	// SpanReconcile is one coordinator reconcile pass; the ownership-change
	// spans of that pass are its children.
	SpanReconcile = "kumi.reconcile"

	// SpanLeaseClaim: the worker claimed a free or expired bucket.
	SpanLeaseClaim = "kumi.lease.claim"
	// SpanLeaseRenewFailed: a renew no longer returned a bucket the worker
	// held; it stops the bucket's reader.
	SpanLeaseRenewFailed = "kumi.lease.renew_failed"
	// SpanLeaseShed: the owner decided a bucket is surplus (over its fair
	// share, or a claimant is waiting) and began draining its reader.
	SpanLeaseShed = "kumi.lease.shed"
	// SpanLeaseHandoffRequest: a joining worker placed a pending claim on a
	// live owner's surplus bucket (first phase of the handoff).
	SpanLeaseHandoffRequest = "kumi.lease.handoff.request"
	// SpanLeaseHandoffGive: the owner, drained, handed the bucket to the
	// claimant (owner side of the handoff).
	SpanLeaseHandoffGive = "kumi.lease.handoff.give"
	// SpanLeaseHandoffTake: the claimant activated a bucket handed to it
	// (claimant side of the handoff).
	SpanLeaseHandoffTake = "kumi.lease.handoff.take"
	// SpanLeaseSteal: the worker took a bucket from a live-looking owner on
	// liveness evidence (kumi.evidence).
	SpanLeaseSteal = "kumi.lease.steal"
	// SpanLeaseRelease: the worker gave a bucket up without a claimant
	// (shutdown, or shedding with nobody waiting).
	SpanLeaseRelease = "kumi.lease.release"
	// SpanLeaseFenceLost: a fenced write (checkpoint, handler transaction)
	// found that the worker no longer holds the bucket at its epoch.
	SpanLeaseFenceLost = "kumi.lease.fence_lost"

	// SpanDeliver is one delivery of one event to the handler, a child of
	// the span that appended the event (W3C trace context from metadata).
	SpanDeliver = "kumi.deliver"
	// SpanPublisherFetch is one read of new events by the publisher.
	SpanPublisherFetch = "kumi.publisher.fetch"
	// SpanReaderFetch is one catch-up read of a bucket by its reader.
	SpanReaderFetch = "kumi.reader.fetch"
	// SpanOverflow is emitted for a queue overflow that happens outside any
	// recording span; inside one, EventOverflow is added to it instead.
	SpanOverflow = "kumi.overflow"
	// SpanSupervision is emitted for a supervision decision taken outside
	// any recording span; inside one, EventSupervision is added instead.
	SpanSupervision = "kumi.supervision"
	// SpanParking is a subscription parking a stream or ending its
	// release, outside any recording span; it carries EventStreamParked or
	// EventStreamReleased (inside one, only the event is added to it).
	SpanParking = "kumi.parking"
)

// Span event names.
const (
	// EventOverflow: a bounded queue overflowed and its policy was applied.
	EventOverflow = "kumi.overflow"
	// EventSupervision: a supervisor decided what to do with a failed actor.
	EventSupervision = "kumi.supervision.decision"
	// EventDeadLetter: the delivery ended in the dead-letter table.
	EventDeadLetter = "kumi.dead_letter"
	// EventLeaseError: a lease operation failed during the span.
	EventLeaseError = "kumi.lease.error"
	// EventNotifierReconnect: the LISTEN connection is being re-established.
	EventNotifierReconnect = "kumi.notifier.reconnect"
	// EventStreamParked: a dead letter parked its stream (or, during a
	// release, parked it again there).
	EventStreamParked = "kumi.stream.parked"
	// EventStreamReleased: a parked stream's release ended: its events
	// flow again.
	EventStreamReleased = "kumi.stream.released"
)

// Attribute keys. Identifiers (event id, stream, position, epoch, peer) go
// on spans only; metrics carry the low-cardinality ones (subscription,
// bucket, worker, outcome, kind, policy, operation, actor, directive).
const (
	AttrSubscription = "kumi.subscription"  // subscription (consumer group) name
	AttrBucket       = "kumi.bucket"        // bucket number within its generation, 0..buckets-1
	AttrGeneration   = "kumi.generation"    // the bucket's generation: 0, then one more per resize
	AttrBuckets      = "kumi.buckets"       // the subscription's bucket count N
	AttrWorker       = "kumi.worker"        // this worker's id
	AttrPeer         = "kumi.peer"          // the other worker of a handoff or steal
	AttrEpoch        = "kumi.epoch"         // lease epoch granted or held
	AttrChange       = "kumi.change"        // ownership-change kind (ChangeKind)
	AttrReason       = "kumi.reason"        // why, short text
	AttrEvidence     = "kumi.evidence"      // liveness evidence of a steal
	AttrAttempt      = "kumi.attempt"       // delivery attempt, from 1
	AttrPosition     = "kumi.position"      // global position of an event
	AttrStream       = "kumi.stream"        // stream name
	AttrEventType    = "kumi.event.type"    // event type
	AttrEventVersion = "kumi.event.version" // event version within its stream
	AttrOutcome      = "kumi.outcome"       // Outcome of a delivery, or ok/error
	AttrOperation    = "kumi.operation"     // lease operation (LeaseOp)
	AttrSource       = "kumi.source"        // fetch source: publisher or reader
	AttrReadOn       = "kumi.read_on"       // read pool: where a page was read, standby or primary
	AttrFrom         = "kumi.from"          // fetch: position read from (exclusive)
	AttrLast         = "kumi.last"          // fetch: last position read
	AttrCount        = "kumi.count"         // fetch: events read
	AttrSubscribers  = "kumi.subscribers"   // publisher fetch: subscribed queues
	AttrPolicy       = "kumi.policy"        // overflow policy
	AttrDepth        = "kumi.depth"         // queue depth at overflow
	AttrCapacity     = "kumi.capacity"      // queue capacity
	AttrDropped      = "kumi.dropped"       // live batches dropped by an overflow
	AttrActor        = "kumi.actor"         // actor kind: coordinator, reader, …
	AttrChild        = "kumi.child"         // failed actor's id (spans only)
	AttrStrategy     = "kumi.strategy"      // supervision strategy
	AttrDirective    = "kumi.directive"     // supervision directive
	AttrRestarts     = "kumi.restarts"      // failures within the window
	AttrBackoff      = "kumi.backoff"       // restart backoff, seconds
	AttrLiveWorkers  = "kumi.live_workers"  // live workers seen by a pass
	AttrFairShare    = "kumi.fair_share"    // ceil(N / live workers)
	AttrOwned        = "kumi.owned"         // buckets owned after a pass
	AttrClaimed      = "kumi.claimed"       // buckets claimed in a pass
	AttrTaken        = "kumi.taken"         // buckets taken by handoff in a pass
	AttrStolen       = "kumi.stolen"        // buckets stolen in a pass
	AttrGiven        = "kumi.given"         // buckets handed off in a pass
	AttrShed         = "kumi.shed"          // buckets shed in a pass
	AttrReleased     = "kumi.released"      // buckets released in a pass
	AttrLost         = "kumi.lost"          // buckets lost (renew failed, fence lost) in a pass
	AttrAction       = "kumi.action"        // a parked stream's release: replay or discard

	// OpenTelemetry messaging semantic conventions, on delivery and fetch
	// spans.
	AttrMessagingSystem        = "messaging.system"              // always "kumi"
	AttrMessagingOperationType = "messaging.operation.type"      // process (deliver), receive (fetch)
	AttrMessagingOperationName = "messaging.operation.name"      // deliver, fetch
	AttrMessagingDestination   = "messaging.destination.name"    // category
	AttrMessagingConsumerGroup = "messaging.consumer.group.name" // subscription
	AttrMessagingMessageID     = "messaging.message.id"          // event id
	AttrMessagingBatchCount    = "messaging.batch.message_count" // events in a fetch
)

// MessagingSystem is the value of messaging.system.
const MessagingSystem = "kumi"

// Metric names. The Prometheus exporter turns dots into underscores and adds
// the unit ("_seconds") and "_total" for counters: kumi.events.acked becomes
// kumi_events_acked_total.
const (
	MetricBucketsOwned        = "kumi.buckets.owned"         // gauge {bucket}: subscription, worker
	MetricLagEvents           = "kumi.lag.events"            // gauge {event}: subscription, bucket
	MetricLagSeconds          = "kumi.lag.seconds"           // gauge s: subscription, bucket
	MetricQueueDepth          = "kumi.queue.depth"           // gauge {batch}: subscription, bucket
	MetricQueueBytes          = "kumi.queue.bytes"           // gauge By: subscription, bucket
	MetricQueueOverflows      = "kumi.queue.overflows"       // counter {overflow}: subscription, policy
	MetricQueueDropped        = "kumi.queue.dropped"         // counter {batch}: subscription, policy
	MetricEventsDelivered     = "kumi.events.delivered"      // counter {event}: subscription, bucket
	MetricEventsAcked         = "kumi.events.acked"          // counter {event}: subscription, bucket
	MetricEventsRetried       = "kumi.events.retried"        // counter {event}: subscription, bucket, outcome
	MetricEventsDeadLettered  = "kumi.events.dead_lettered"  // counter {event}: subscription, bucket
	MetricHandlerDuration     = "kumi.handler.duration"      // histogram s: subscription, outcome
	MetricOwnershipChanges    = "kumi.ownership.changes"     // counter {change}: subscription, change
	MetricLeaseOperations     = "kumi.lease.operations"      // counter {operation}: subscription, operation, outcome
	MetricLeaseDuration       = "kumi.lease.duration"        // histogram s: subscription, operation
	MetricLeasePassesLate     = "kumi.lease.passes.late"     // counter {pass}: subscription
	MetricRebalances          = "kumi.rebalances"            // counter {rebalance}: subscription
	MetricReconcileDuration   = "kumi.reconcile.duration"    // histogram s: subscription, outcome
	MetricFetchDuration       = "kumi.fetch.duration"        // histogram s: source, outcome
	MetricFetchEvents         = "kumi.fetch.events"          // counter {event}: source
	MetricNotifierReconnects  = "kumi.notifier.reconnects"   // counter {reconnect}
	MetricSupervisionDecision = "kumi.supervision.decisions" // counter {decision}: actor, directive
	MetricSupervisionRestarts = "kumi.supervision.restarts"  // counter {restart}: actor
	MetricParkedStreams       = "kumi.parked.streams"        // gauge {stream}: subscription, bucket
	MetricParkedReleases      = "kumi.parked.releases"       // counter {release}: subscription, action
)

// The sequencer's metrics (see observability.Telemetry.RegisterSequencer); no
// attributes: one sequencer per process.
const (
	MetricSequencerBacklogSeconds = "kumi.sequencer.backlog.seconds" // gauge s
	MetricSequencerFailing        = "kumi.sequencer.failing"         // gauge {failure}
	MetricSequencerStuck          = "kumi.sequencer.stuck"           // gauge {sequencer}: 0 or 1
	MetricSequencerBatch          = "kumi.sequencer.batch"           // gauge {event}
	MetricSequencerTimeouts       = "kumi.sequencer.timeouts"        // counter {step}
	MetricSequencerResets         = "kumi.sequencer.resets"          // counter {reset}
	MetricSequencerTakeovers      = "kumi.sequencer.takeovers"       // counter {takeover}
	MetricSequencerStranded       = "kumi.sequencer.stranded"        // counter {event}
	MetricStoreServerChanges      = "kumi.store.server_changes"      // counter {change}
)

// The read replica's metrics (see observability.Telemetry.RegisterReplica), when the
// runtime reads on a hot standby (actors.RuntimeOptions.ReadPool).
const (
	MetricReplicaLagEvents   = "kumi.replica.lag.events"   // gauge {event}
	MetricReplicaLagSeconds  = "kumi.replica.lag.seconds"  // gauge s
	MetricReplicaFallingBack = "kumi.replica.falling_back" // gauge {replica}: 0 or 1
	MetricReplicaReads       = "kumi.replica.reads"        // counter {read}: read_on
)

// Units of the read replica's metrics.
const (
	UnitReplica = "{replica}"
	UnitRead    = "{read}"
)

// Units of the sequencer's metrics.
const (
	UnitFailure   = "{failure}"
	UnitSequencer = "{sequencer}"
	UnitStep      = "{step}"
	UnitReset     = "{reset}"
	UnitTakeover  = "{takeover}"
)

// Metric units (UCUM, as OpenTelemetry recommends).
const (
	UnitSeconds   = "s"
	UnitBytes     = "By"
	UnitBucket    = "{bucket}"
	UnitEvent     = "{event}"
	UnitBatch     = "{batch}"
	UnitOverflow  = "{overflow}"
	UnitChange    = "{change}"
	UnitOperation = "{operation}"
	UnitRebalance = "{rebalance}"
	UnitPass      = "{pass}"
	UnitReconnect = "{reconnect}"
	UnitDecision  = "{decision}"
	UnitRestart   = "{restart}"
	UnitStream    = "{stream}"
	UnitRelease   = "{release}"
)

// Values of kumi.outcome for operations that simply succeed or fail.
const (
	OutcomeOK    = "ok"
	OutcomeError = "error"
)

// Overflow policies (attribute kumi.policy). The runtime maps its own policy
// type onto these strings so that labels stay stable.
const (
	PolicyPauseAndResume   = "pause_and_resume"
	PolicyDropSubscription = "drop_subscription"
	PolicyDropOldest       = "drop_oldest"
)

// Supervision directives (attribute kumi.directive).
const (
	DirectiveRestart  = "restart"
	DirectiveStop     = "stop"
	DirectiveResume   = "resume"
	DirectiveEscalate = "escalate"
)

// Fetch sources (attribute kumi.source).
const (
	SourcePublisher = "publisher"
	SourceReader    = "reader"
)
