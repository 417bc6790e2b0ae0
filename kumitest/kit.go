package kumitest

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/uuid"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// AnswerWaitDefault is how long, in real time, the kit waits for a
// handler's answer before it takes the delivery as timed out (see
// [Options.AnswerWait]).
const AnswerWaitDefault = 5 * time.Second

// Options configure a [Kit].
type Options struct {
	// Group is the group the handler runs in, as given to a Runtime's
	// StartGroup: its Handler (which [Kit.Check] may take from each World
	// instead), Subscription, Category and Buckets, and the
	// delivery options the kit applies — Retry (on simulated time),
	// HandlerTimeout, MaxInFlight (1 lets CommitWithCheckpoint commit),
	// CheckpointEvery and Batch. Zero fields take their defaults.
	Group actors.GroupOptions
	// Store, when set, is an event store the kit appends the given events
	// to, and whose leases it holds, so that a handler writing through
	// actors.CommitWithCheckpoint commits for real, fenced by a real lease
	// of its bucket. The store's schema must be migrated (actors.Migrate).
	// Each pass then runs under a subscription of its own, Subscription
	// followed by "-kit" and the pass's number, so that it starts from no
	// checkpoint. nil: the events live in memory.
	Store *eventsource.Store
	// AnswerWait bounds, in real time, the wait for each answer; a handler
	// that has not answered by then has timed out (HandlerTimeout passes on
	// the simulated clock), and one still in its call is replaced, as a
	// hung handler is. Default AnswerWaitDefault. A pass ends once the
	// calls given up on have returned (their contexts are cancelled): it
	// fails if one has not within AnswerWait or 10 s, whichever is longer.
	AnswerWait time.Duration
}

// Event is an event given to the kit. Its stream's category must be the
// group's; the kit numbers the versions of each stream in the order given,
// from 0, and the positions of all events in that order, from 1.
type Event struct {
	Stream string
	Type   string
	// Data is the event's data: a []byte or json.RawMessage as is, any
	// other value encoded as JSON (nil: {}).
	Data any
}

// Kit runs one handler through kumi's delivery contract: the handler's
// props spawned in an in-process actor system with kumi's middleware,
// real *actors.Delivery (or *actors.Batch) messages, and replies read as a
// group's reader reads them, with the group's retry policy applied on a
// simulated clock — no worker pool, no leases (unless Options.Store), no
// sleeps. Make one with [New]; a Kit runs one pass at a time.
type Kit struct {
	opts   Options
	system *actor.ActorSystem
	sup    *supervisor.Strategy
	passes int
	// given caches the events appended for a list of Events (Store mode).
	given map[string][]eventsource.RecordedEvent
}

// New returns a kit for opts. Invalid options are refused with a
// *kumierr.ConfigError naming the field. Call [Kit.Close] when done (New's
// caller in a test: t.Cleanup(k.Close)).
func New(opts Options) (*Kit, error) {
	if opts.AnswerWait < 0 {
		return nil, &kumierr.ConfigError{Field: "kumitest.Options.AnswerWait", Value: opts.AnswerWait, Reason: "must be positive (0 means 5s)"}
	}
	if opts.AnswerWait == 0 {
		opts.AnswerWait = AnswerWaitDefault
	}
	g := opts.Group.WithDefaults()
	user := g.Handler
	if user == nil { // Check may take it from each World
		g.Handler = actor.PropsFromFunc(func(actor.Context) {})
	}
	if err := g.Validate(); err != nil {
		return nil, err
	}
	g.Handler = user
	opts.Group = g
	sup, err := supervisor.OneForOne(supervisor.Options{
		// Restarts wait on no real clock: the kit's time is simulated.
		Backoff:  supervision.Backoff{Initial: time.Microsecond, Max: time.Microsecond},
		Observer: supervision.ObserverFunc(func(supervision.Decision) {}),
	})
	if err != nil {
		return nil, err
	}
	system := actor.NewActorSystem(actor.WithLoggerFactory(observability.ProtoactorLoggerFactory(nil)))
	return &Kit{opts: opts, system: system, sup: sup, given: map[string][]eventsource.RecordedEvent{}}, nil
}

// Close stops the kit's actor system.
func (k *Kit) Close() {
	k.sup.Close()
	k.system.Shutdown()
}

// Run delivers events once, as a group would with no fault: each event
// until it is acked or dead-lettered, retries included. It returns what
// happened once every handler actor has stopped, so whatever a handler
// does after it responds is done by then; err reports a failure of the kit
// itself (a database call in Store mode, an invalid event, a handler that
// did not stop).
func (k *Kit) Run(ctx context.Context, events ...Event) (*Result, error) {
	return k.RunFault(ctx, "", 0, events...)
}

// RunFault delivers events as [Kit.Run] does, under the fault schedule f
// drawn from seed ("" for none). The same events, schedule and seed make
// the same schedule.
func (k *Kit) RunFault(ctx context.Context, f Fault, seed int64, events ...Event) (*Result, error) {
	if f != "" && !f.valid() {
		return nil, &kumierr.ConfigError{Field: "kumitest.Fault", Value: string(f), Reason: fmt.Sprintf("unknown: use one of %v", Faults())}
	}
	if k.opts.Group.Handler == nil {
		return nil, &kumierr.ConfigError{Field: "kumitest.Options.Group.Handler", Reason: "is required to run (Kit.Check takes it from each World)"}
	}
	recorded, err := k.record(ctx, events)
	if err != nil {
		return nil, err
	}
	return k.pass(ctx, k.opts.Group.Handler, recorded, newPlan(f, seed, recorded, k.opts.Group))
}

// record turns events into recorded events: in memory, numbered by the
// kit; in Store mode, appended (once per list of events) and read back.
func (k *Kit) record(ctx context.Context, events []Event) ([]eventsource.RecordedEvent, error) {
	if k.opts.Store != nil {
		return k.appended(ctx, events)
	}
	out := make([]eventsource.RecordedEvent, len(events))
	versions := map[string]int64{}
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i, e := range events {
		name, data, err := k.check(i, e)
		if err != nil {
			return nil, err
		}
		v := versions[e.Stream]
		versions[e.Stream]++
		out[i] = eventsource.RecordedEvent{
			ID:     uuid.NewSHA1(uuid.NameSpaceURL, fmt.Appendf(nil, "kumitest:%s:%d", e.Stream, v)),
			Stream: e.Stream, Category: name.Category, Version: v, Position: int64(i + 1),
			Hash: eventsource.Hash(name.CardinalID), Type: e.Type, Data: data,
			RecordedAt: start.Add(time.Duration(i) * time.Millisecond),
		}
	}
	return out, nil
}

// check validates event i and returns its stream's name and its data.
func (k *Kit) check(i int, e Event) (eventsource.StreamName, json.RawMessage, error) {
	field := fmt.Sprintf("kumitest.Event[%d]", i)
	name, err := eventsource.ParseStreamName(e.Stream)
	if err != nil {
		return name, nil, &kumierr.ConfigError{Field: field + ".Stream", Value: e.Stream, Reason: err.Error()}
	}
	if name.Category != k.opts.Group.Category {
		return name, nil, &kumierr.ConfigError{Field: field + ".Stream", Value: e.Stream,
			Reason: fmt.Sprintf("is not of the group's category %q: the group would never see it", k.opts.Group.Category)}
	}
	if e.Type == "" {
		return name, nil, &kumierr.ConfigError{Field: field + ".Type", Reason: "is required"}
	}
	var data json.RawMessage
	switch d := e.Data.(type) {
	case nil:
		data = json.RawMessage(`{}`)
	case []byte:
		data = d
	case json.RawMessage:
		data = d
	default:
		if data, err = json.Marshal(d); err != nil {
			return name, nil, &kumierr.ConfigError{Field: field + ".Data", Value: fmt.Sprintf("%T", d), Reason: err.Error()}
		}
	}
	return name, data, nil
}

// Result is what a pass did.
type Result struct {
	// Outcomes has one entry per given event, in the order given: how it
	// ended the first time it was done.
	Outcomes []Outcome
	// Deliveries is every delivery made, in order, faults' included.
	Deliveries []Delivery
	// Elapsed is the simulated time the pass took: retries' backoffs and
	// Retry.After, and HandlerTimeout for each timeout.
	Elapsed time.Duration
}

// Outcome is how one event ended.
type Outcome struct {
	Event eventsource.RecordedEvent
	// Acked: the handler acked it; Committed: with its checkpoint
	// (actors.CommitWithCheckpoint).
	Acked, Committed bool
	// DeadLetter is the dead letter's reason when the event was
	// dead-lettered ("" otherwise).
	DeadLetter string
	// Attempts counts its deliveries until it was done.
	Attempts int
}

// Delivery is one delivery of the pass.
type Delivery struct {
	// Event is the delivery's event: a batch's first.
	Event eventsource.RecordedEvent
	// Events counts the events delivered: more than 1 for a batch.
	Events int
	// Attempt, Generation, Bucket and Epoch are the *actors.Delivery's.
	Attempt            int
	Generation, Bucket int
	Epoch              int64
	// Handler numbers the handler actor it went to: a new number for each
	// actor the kit spawns (a replacement, a new owner's).
	Handler int
	// Outcome is what the answer meant (ack, retry, panic, timeout,
	// dead_letter; cancelled for an answer a crash lost) and Reason why.
	Outcome observability.Outcome
	Reason  string
	// At is the simulated time of the delivery, from the pass's start.
	At time.Duration
	// Fault is the schedule that made this delivery ("" for the regular
	// path): a crash's redelivery, a duplicate, the attempt a timeout gave
	// up on, the first delivery after a handoff, one of the generation
	// after a resize cut.
	Fault Fault
	// Ignored: the answer was not acted on (a crash lost it, a duplicate's,
	// an attempt given up on).
	Ignored bool
}

// Acked returns the number of events acked.
func (r *Result) Acked() int {
	n := 0
	for _, o := range r.Outcomes {
		if o.Acked {
			n++
		}
	}
	return n
}

// DeadLetters returns the outcomes of the events dead-lettered.
func (r *Result) DeadLetters() []Outcome {
	var out []Outcome
	for _, o := range r.Outcomes {
		if o.DeadLetter != "" {
			out = append(out, o)
		}
	}
	return out
}

// Retries returns the number of deliveries answered with a retry (a Retry,
// a panic, a timeout).
func (r *Result) Retries() int {
	n := 0
	for _, d := range r.Deliveries {
		switch d.Outcome {
		case observability.OutcomeRetry, observability.OutcomePanic, observability.OutcomeTimeout:
			n++
		}
	}
	return n
}

// Of returns the deliveries made by fault f ("" for the regular path).
func (r *Result) Of(f Fault) []Delivery {
	var out []Delivery
	for _, d := range r.Deliveries {
		if d.Fault == f {
			out = append(out, d)
		}
	}
	return out
}
