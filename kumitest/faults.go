package kumitest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
)

// Fault names a fault schedule: a way kumi's guarantees allow a handler's
// events to arrive other than once, in order (docs/guarantees.md, "When
// duplicates happen"). Each is drawn from a seed.
type Fault string

const (
	// CrashTail: a worker dies after its handler handled an event, before
	// the answer counted; the next owner (a new epoch, a new handler)
	// delivers again everything after the last checkpoint written — version
	// 6 again after version 7.
	CrashTail Fault = "crash-tail"
	// Duplicates: events delivered a second time right after their ack, as
	// by a zombie or a replay.
	Duplicates Fault = "duplicates"
	// TimeoutRetry: an attempt outlives HandlerTimeout; its handler is
	// replaced and the retry goes to the successor while the first call may
	// still be running.
	TimeoutRetry Fault = "timeout-retry"
	// Handoff: the bucket moves to another owner in the middle of a stream
	// (a drain, a new epoch, a new handler); nothing is repeated.
	Handoff Fault = "handoff"
	// ResizeCut: the subscription is resized at an event in the middle of a
	// stream; the events after the cut come from the next generation's
	// buckets (another bucket count, Delivery.Generation 1), with handlers
	// of their own.
	ResizeCut Fault = "resize-cut"
	// BatchSplit: with batches (GroupOptions.Batch), each batch is cut at a
	// random size; without them it is not run.
	BatchSplit Fault = "batch-split"
)

// Faults returns every fault schedule.
func Faults() []Fault {
	return []Fault{CrashTail, Duplicates, TimeoutRetry, Handoff, ResizeCut, BatchSplit}
}

func (f Fault) valid() bool {
	for _, g := range Faults() {
		if f == g {
			return true
		}
	}
	return false
}

// plan is a fault schedule drawn for one list of events.
type plan struct {
	rng     *rand.Rand
	crash   map[int64]bool // after delivering the event at this position, the worker crashes
	dup     map[int64]bool // after its ack, the event is delivered again
	timeout map[int64]bool // its first attempt times out while running
	handoff map[int64]bool // before its first delivery, the bucket is handed off
	cut     int64          // resize: events after this position go to generation 1
	cutN    int
	split   bool
}

// take reports whether set holds pos, and removes it: each fault acts once.
func (p *plan) take(set map[int64]bool, pos int64) bool {
	if !set[pos] {
		return false
	}
	delete(set, pos)
	return true
}

// newPlan draws fault f's schedule for events from seed.
func newPlan(f Fault, seed int64, events []eventsource.RecordedEvent, g actors.GroupOptions) *plan {
	p := &plan{rng: rand.New(rand.NewPCG(uint64(seed), 0x6b756d6974657374)), crash: map[int64]bool{},
		dup: map[int64]bool{}, timeout: map[int64]bool{}, handoff: map[int64]bool{}}
	if len(events) == 0 {
		return p
	}
	pick := func(set map[int64]bool, among []eventsource.RecordedEvent, oneIn int) {
		for _, e := range among {
			if p.rng.IntN(oneIn) == 0 {
				set[e.Position] = true
			}
		}
		if len(set) == 0 && len(among) > 0 {
			set[among[p.rng.IntN(len(among))].Position] = true
		}
	}
	// Events with an earlier and a later one in their stream.
	last := map[string]int64{}
	for _, e := range events {
		last[e.Stream] = e.Version
	}
	var middle []eventsource.RecordedEvent
	for _, e := range events {
		if e.Version > 0 && e.Version < last[e.Stream] {
			middle = append(middle, e)
		}
	}
	if len(middle) == 0 {
		middle = events[1:]
	}
	switch f {
	case CrashTail:
		pick(p.crash, events, 8)
	case Duplicates:
		pick(p.dup, events, 5)
	case TimeoutRetry:
		pick(p.timeout, events, 8)
	case Handoff:
		pick(p.handoff, middle, 6)
	case ResizeCut:
		if len(middle) > 0 {
			p.cut = middle[p.rng.IntN(len(middle))].Position - 1
		}
		n := g.Buckets
		choices := []int{n + 1, 2 * n}
		if n > 1 {
			choices = append(choices, n/2)
		}
		p.cutN = choices[p.rng.IntN(len(choices))]
	case BatchSplit:
		p.split = true
	}
	return p
}

// World is what one pass of [Kit.Check] runs against: a handler and its
// effects, fresh for each pass.
type World struct {
	// Handler is the handler's props; nil: the kit's Group.Handler.
	Handler *actor.Props
	// Effects returns the handler's effects after the pass: its state, or
	// a read of what it wrote. The effects of a faulty pass must equal
	// (reflect.DeepEqual) those of the clean one.
	Effects func() any
}

// CheckOptions say which schedules [Kit.Check] runs.
type CheckOptions struct {
	// Faults are the schedules; nil: all of them ([Faults]).
	Faults []Fault
	// Seed is the first seed (0 means 1) and Seeds how many seeds are run
	// per schedule, Seed, Seed+1, ... (0 means 8). A FaultError names the
	// seed that broke: set Seed to it and Seeds to 1 to replay it.
	Seed  int64
	Seeds int
}

// FaultError reports a fault schedule under which a handler's effects
// differ from those of one clean pass: the handler is not idempotent for
// what kumi's guarantees allow.
type FaultError struct {
	Fault Fault
	Seed  int64
	// Clean and Faulty are the effects of the clean pass and of the faulty
	// one.
	Clean, Faulty any
	// Result is the faulty pass's.
	Result *Result
}

// Error names the schedule and seed, says how to replay it, and shows the
// effects.
func (e *FaultError) Error() string {
	var faulty []string
	for _, d := range e.Result.Of(e.Fault) {
		faulty = append(faulty, fmt.Sprintf("%s@%d", d.Event.Stream, d.Event.Version))
	}
	return fmt.Sprintf("kumitest: the handler's effects after fault schedule %s (seed %d) differ from one clean pass "+
		"(replay: kumitest.CheckOptions{Faults: []kumitest.Fault{%q}, Seed: %d, Seeds: 1}; its fault's deliveries: %s):\n"+
		"  clean:  %+v\n  faulty: %+v", e.Fault, e.Seed, string(e.Fault), e.Seed, strings.Join(faulty, " "), e.Clean, e.Faulty)
}

// Check runs events through one clean pass and then through every fault
// schedule of o, each with a fresh world from world, and compares the
// effects. It returns a *[FaultError] for the first schedule and seed
// whose effects differ, nil when none do, and other errors for failures
// of the kit itself. Without batches (GroupOptions.Batch), BatchSplit is
// skipped.
func (k *Kit) Check(ctx context.Context, events []Event, world func() World, o CheckOptions) error {
	if world == nil {
		return &kumierr.ConfigError{Field: "kumitest.Kit.Check.world", Reason: "is required: a function returning a fresh World"}
	}
	if o.Seeds < 0 {
		return &kumierr.ConfigError{Field: "kumitest.CheckOptions.Seeds", Value: o.Seeds, Reason: "must be positive (0 means 8)"}
	}
	if o.Seeds == 0 {
		o.Seeds = 8
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	faults := o.Faults
	if faults == nil {
		faults = Faults()
	}
	for _, f := range faults {
		if !f.valid() {
			return &kumierr.ConfigError{Field: "kumitest.CheckOptions.Faults", Value: string(f), Reason: fmt.Sprintf("unknown: use one of %v", Faults())}
		}
	}
	recorded, err := k.record(ctx, events)
	if err != nil {
		return err
	}
	clean, _, err := k.inWorld(ctx, world, recorded, "", 0)
	if err != nil {
		return err
	}
	for _, f := range faults {
		if f == BatchSplit && k.opts.Group.Batch.MaxEvents == 0 {
			continue
		}
		for seed := o.Seed; seed < o.Seed+int64(o.Seeds); seed++ {
			faulty, res, err := k.inWorld(ctx, world, recorded, f, seed)
			if err != nil {
				return fmt.Errorf("kumitest: fault schedule %s (seed %d): %w", f, seed, err)
			}
			if !reflect.DeepEqual(clean, faulty) {
				return &FaultError{Fault: f, Seed: seed, Clean: clean, Faulty: faulty, Result: res}
			}
		}
	}
	return nil
}

// inWorld runs one pass in a fresh world and returns its effects.
func (k *Kit) inWorld(ctx context.Context, world func() World, events []eventsource.RecordedEvent, f Fault, seed int64) (any, *Result, error) {
	w := world()
	if w.Effects == nil {
		return nil, nil, &kumierr.ConfigError{Field: "kumitest.World.Effects", Reason: "is required: the handler's effects to compare"}
	}
	h := w.Handler
	if h == nil {
		h = k.opts.Group.Handler
	}
	if h == nil {
		return nil, nil, &kumierr.ConfigError{Field: "kumitest.World.Handler", Reason: "is required when Options.Group.Handler is nil"}
	}
	res, err := k.pass(ctx, h, events, newPlan(f, seed, events, k.opts.Group))
	if err != nil {
		return nil, nil, err
	}
	return w.Effects(), res, nil
}
