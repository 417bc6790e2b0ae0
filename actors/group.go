package actors

// The group: its types, the state its actors share, and the setters of that state.

import (
	"context"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/overflow"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/leasestore"
	"github.com/kumi-run/kumi/observability"
	"github.com/kumi-run/kumi/supervision"
)

// Group is one subscription group running in this process: a Coordinator
// actor and a BucketReader per owned bucket. Its Start and Stop follow
// kumi's lifecycle contract (docs/design/architecture.md, "Lifecycle"):
// [Runtime.NewGroup] makes one, [Group.Start] starts it, and
// [Runtime.StartGroup] does both. It runs until [Group.Stop], or until it
// ends on its own (see [Group.Done]).
type Group struct {
	g           *group
	coordinator *actor.PID // set by Start
	life        startstop.Lifecycle
}

// group is what a group's actors share.
type group struct {
	rt     *Runtime
	opts   GroupOptions
	store  *eventsource.Store
	leases *leasestore.Store
	// life bounds every lease-store call of the group; finish ends it, so
	// that no call in flight holds up the runtime's lease pool's Close.
	life              context.Context
	endLife           context.CancelFunc
	publisher         *actor.PID
	logger            *slog.Logger
	telemetry         *telemetry
	handlerSupervisor *supervisor.Strategy
	answerWarned      sync.Map // answerWarning → struct{}: handler contract warnings given (deliver.go)
	readerSupervisor  *supervisor.Strategy
	// coordinatorSupervisor restarts a failed coordinator (its readers
	// stop with it; the restarted one reclaims and respawns, its readers
	// starting after what theirs handled at the same epochs: see marks).
	coordinatorSupervisor *supervisor.Strategy
	// marks is what the slots' readers handled, by slot and epoch: it
	// outlives the coordinator's incarnations (see handledMarks).
	marks    handledMarks
	interval time.Duration

	mu          sync.Mutex
	owned       map[int]leasestore.Lease
	handoff     map[int]bool
	progress    map[int]int64
	lags        map[int]bucketLag
	lagAt       time.Time
	liveWorkers int
	queues      map[int]*overflow.Queue
	done        chan struct{}
	err         error
	// failure is why the coordinator's guardian stopped it, if it did.
	failure *GroupFailedError
	// renewedAt is when the last successful lease pass started (the
	// group's start before the first); passErr the error of the last
	// pass, nil once one succeeds.
	renewedAt  time.Time
	passErr    error
	unregister func()
	// dropped counts the pauses and overflows of the readers' queues,
	// each of which dropped what its queue held (re-read from the store);
	// kumi.queue.dropped counts the batches.
	dropped atomic.Int64
	// readerStates holds the readers' states other than reading (see
	// setReaderState), guarded by mu.
	readerStates map[int]string
	// reports holds what each slot's reader last reported of itself (see
	// reader.report), guarded by mu.
	reports map[int]readerReport
	// resize is the subscription's generation and resize as the last pass
	// read them, guarded by mu.
	resize leasestore.Resize
	// parkedHolds counts the parked streams the readers hold (see
	// release.go).
	parkedHolds parkedHolds
}

// setResize records the resize the last pass read.
func (g *group) setResize(r leasestore.Resize) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.resize = r
}

// queueTransition counts and reports a reader queue's pause or overflow.
func (g *group) queueTransition(bucket int) func(overflow.Transition) {
	report := g.telemetry.queueTransition(bucket, g.opts.Overflow)
	return func(tr overflow.Transition) {
		if tr.To != overflow.Active {
			g.dropped.Add(1)
		}
		report(tr)
	}
}

// bucketLag is a bucket's backlog as measured after a pass.
type bucketLag struct {
	checkpoint int64
	events     int64
	oldest     time.Time
}

// Worker returns this worker's id in the group.
func (gr *Group) Worker() string { return gr.g.opts.Worker }

// Done is closed when the group has stopped: by [Group.Stop], by
// [Group.Abort], or on a failure it cannot recover from (see [Group.Err]).
func (gr *Group) Done() <-chan struct{} { return gr.g.done }

// Err returns why the group ended, once [Group.Done] is closed: nil after
// a clean stop, ctx.Err() when a Stop's context ended first, the error of
// the final lease release, or a *[GroupFailedError] when a failure nothing
// restarts ended it (a reader's configuration error: a missing table or
// grant). While the group runs it returns nil.
func (gr *Group) Err() error {
	gr.g.mu.Lock()
	defer gr.g.mu.Unlock()
	return gr.g.err
}

// ownedBuckets returns the buckets the group holds, sorted.
func (g *group) ownedBuckets() []int {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make([]int, 0, len(g.owned))
	for b := range g.owned {
		out = append(out, b)
	}
	sort.Ints(out)
	return out
}

func (g *group) setOwned(owned map[int]leasestore.Lease, handoff map[int]bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.owned = make(map[int]leasestore.Lease, len(owned))
	for b, l := range owned {
		g.owned[b] = l
	}
	g.handoff = make(map[int]bool, len(handoff))
	for b := range handoff {
		g.handoff[b] = true
	}
	for b := range g.queues {
		if _, ok := owned[b]; !ok {
			delete(g.queues, b)
		}
	}
}

// observer reports supervision decisions about actors of a kind to the
// telemetry and to the runtime's observer.
func (g *group) observer(kind string) supervision.Observer {
	return supervision.Observers(g.rt.opts.Supervision, supervision.ObserverFunc(func(d supervision.Decision) {
		g.telemetry.t.SupervisionDecision(context.Background(), observability.SupervisionInfo{
			Actor: kind, Child: d.Child, Subscription: g.opts.Subscription, Strategy: d.Strategy,
			Directive: d.Directive.String(), Reason: d.Reason, Restarts: d.Attempt, Backoff: d.Delay,
		})
	}))
}

// coordinatorDecision notes a decision of the coordinator's guardian to
// stop it: a failure nothing restarts (a reader's configuration error,
// escalated, or the coordinator's restart budget exhausted). The
// coordinator then ends the group with it (see coordinator.onStopped).
func (g *group) coordinatorDecision(d supervision.Decision) {
	if d.Directive != actor.StopDirective {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.failure == nil {
		g.failure = newGroupFailedError(g.opts.Subscription, d)
	}
}

// failed returns why the coordinator's guardian stopped it, or nil.
func (g *group) failed() *GroupFailedError {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.failure
}

func (g *group) setProgress(bucket int, pos int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.progress[bucket] = max(g.progress[bucket], pos)
}

func (g *group) registerQueue(bucket int, q *overflow.Queue) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.queues[bucket] = q
}
