package actors

import (
	"context"
	"fmt"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/window"
)

// DeadLetterAction is what a subscription does with the rest of a stream
// once one of its events is dead-lettered (GroupOptions.OnDeadLetter; see
// docs/guarantees.md and docs/design/parking.md).
type DeadLetterAction uint8

const (
	// SkipEvent (the default) records the dead letter and goes on: the
	// stream's later events are delivered; replaying the letter later
	// delivers it after them.
	SkipEvent DeadLetterAction = iota
	// ParkStream records the dead letter and parks its stream, fenced by
	// the bucket's lease: the stream's later events are not delivered —
	// they wait in the store, in order — while the bucket's other streams
	// go on and its checkpoint moves over them. An operator releases the
	// stream (kumi parked replay, discard) or skips it for good.
	ParkStream
)

// String names the action ("skip_event", "park_stream").
func (a DeadLetterAction) String() string {
	switch a {
	case SkipEvent:
		return "skip_event"
	case ParkStream:
		return "park_stream"
	}
	return fmt.Sprintf("DeadLetterAction(%d)", uint8(a))
}

// The reader's side of parking (docs/design/parking.md, the reader's
// contract). A reader of a group that parks (OnDeadLetter ParkStream)
// loads its bucket's parked streams before it reads (contract 1); writes
// each dead letter with eventsource.Store.ParkStream, fenced by its lease,
// the letter's slot holding the stream until it lands (contract 2); and
// marks every event of a parked stream parked as it gives it to its
// window, which finishes it as it takes it, never sent, so that the
// checkpoint passes it (contract 3; internal/window/parked.go).

// parkedPage is how many parked streams a reader loads per query.
const parkedPage = 1000

// readParked reads the reader's bucket's parked streams (none unless the
// group parks): the rows whose stream hashes to its bucket of its
// generation, so a stream parked in another generation is found where it
// is now.
func (r *reader) readParked(c context.Context) ([]eventsource.ParkedStream, error) {
	if r.g.opts.OnDeadLetter != ParkStream {
		return nil, nil
	}
	var all []eventsource.ParkedStream
	after := ""
	for {
		page, err := r.g.store.ParkedStreams(c, r.g.opts.Subscription,
			eventsource.ParkedFilter{Buckets: r.size, Bucket: r.genBucket, After: after, Limit: parkedPage})
		if err != nil {
			return nil, fmt.Errorf("load parked streams: %w", err)
		}
		all = append(all, page...)
		if len(page) < parkedPage {
			return all, nil
		}
		after = page[len(page)-1].Stream
	}
}

// loadParked makes rows the reader's set of parked streams (nil unless
// the group parks).
func (r *reader) loadParked(rows []eventsource.ParkedStream) {
	if r.g.opts.OnDeadLetter != ParkStream {
		return
	}
	r.parked = make(map[string]eventsource.ParkAction, len(rows))
	for _, p := range rows {
		r.parked[p.Stream] = p.Action
	}
	r.noteParkedHeld()
}

// isParked reports whether stream is parked for the reader's bucket: its
// events are done as the window takes them, never delivered.
func (r *reader) isParked(stream string) bool {
	if r.parked == nil {
		return false
	}
	_, ok := r.parked[stream]
	return ok
}

// park writes a dead letter and parks its stream, fenced by the reader's
// lease; the answer names the window's slot (see wdeadLettered).
func (r *reader) park(ctx actor.Context, dl eventsource.DeadLetter, id uint64) {
	fence := r.fence
	r.async(ctx, func(c context.Context) any {
		p, err := r.g.store.ParkStream(c, dl, fence)
		if err != nil {
			return &deadLettered{inc: r, id: id, err: err}
		}
		return &deadLettered{inc: r, id: id, parked: &p}
	})
}

// parkedStream takes a park written: the stream joins the reader's set,
// and the window finishes the letter's slot and the stream's later ones.
func (r *reader) parkedStream(m *deadLettered) window.Effects {
	p := m.parked
	r.parked[p.Stream] = p.Action
	r.noteParkedHeld()
	r.g.telemetry.parking(r.bucket, *p, false)
	return r.ws.st.Parked(m.id)
}
