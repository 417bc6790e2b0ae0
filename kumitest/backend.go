package kumitest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/leasestore"
)

// backend is where a pass's leases and checkpoints live: nowhere (in
// memory), or in the kit's Store.
type backend interface {
	// lease returns the epoch and fence of a first owner of the bucket.
	lease(gen, bucket, n int) (int64, eventsource.Fence, error)
	// move gives the bucket to a new owner, at a new epoch.
	move(gen, bucket, n int) (int64, eventsource.Fence, error)
	// flush writes the bucket's checkpoint, fenced.
	flush(subscription string, slot int, pos int64, fence eventsource.Fence) error
	// deadLetter records a dead letter.
	deadLetter(dl eventsource.DeadLetter) error
	close()
}

// backend returns the backend of a pass under subscription.
func (k *Kit) backend(ctx context.Context, subscription string) (backend, error) {
	if k.opts.Store == nil {
		return &memory{}, nil
	}
	return &stored{ctx: ctx, store: k.opts.Store, subscription: subscription}, nil
}

// memory has epochs and no fence: a handler that commits through
// CommitWithCheckpoint needs Options.Store.
type memory struct{ epochs int64 }

func (m *memory) lease(int, int, int) (int64, eventsource.Fence, error) {
	m.epochs++
	return m.epochs, nil, nil
}
func (m *memory) move(g, b, n int) (int64, eventsource.Fence, error) { return m.lease(g, b, n) }
func (m *memory) flush(string, int, int64, eventsource.Fence) error  { return nil }
func (m *memory) deadLetter(eventsource.DeadLetter) error            { return nil }
func (m *memory) close()                                             {}

// stored holds real leases in the store's database. Each slot's lease
// is the one bucket of a lease subscription of its own,
// "<subscription>-s<slot>", held by one lease store (a worker) per owner:
// each move is a release by the owner and a claim by a new worker, at a
// new epoch, and the old owner's fence is refused from then on. The
// checkpoints are the pass's subscription's, slot by slot, as a group's.
type stored struct {
	ctx          context.Context
	store        *eventsource.Store
	subscription string
	owners       map[int]*leasestore.Store // by slot
	workers      []*leasestore.Store
}

func (s *stored) lease(gen, bucket, n int) (int64, eventsource.Fence, error) {
	return s.move(gen, bucket, n)
}

// move has the slot's owner, if any, release it, and a new worker claim it.
func (s *stored) move(gen, bucket, _ int) (int64, eventsource.Fence, error) {
	slot := eventsource.Slot(gen, bucket)
	if s.owners == nil {
		s.owners = map[int]*leasestore.Store{}
	}
	if old := s.owners[slot]; old != nil {
		if err := old.Release(s.ctx, []int{0}); err != nil {
			return 0, nil, fmt.Errorf("kumitest: release slot %d: %w", slot, err)
		}
	}
	w, err := leasestore.New(s.store.Pool(), leasestore.Config{Schema: s.store.Schema(),
		Subscription: fmt.Sprintf("%s-s%d", s.subscription, slot), Worker: "kumitest-" + uuid.NewString()[:8], Buckets: 1,
		LeaseOptions: leasestore.LeaseOptions{TTL: time.Hour, Heartbeat: time.Minute, NoListen: true}})
	if err != nil {
		return 0, nil, err
	}
	if err := w.Start(s.ctx); err != nil {
		return 0, nil, fmt.Errorf("kumitest: start a lease store: %w", err)
	}
	s.workers = append(s.workers, w)
	res, err := w.Pass(s.ctx)
	if err != nil {
		return 0, nil, fmt.Errorf("kumitest: claim slot %d: %w", slot, err)
	}
	if len(res.Owned) != 1 {
		return 0, nil, fmt.Errorf("kumitest: a new worker did not get the lease of slot %d", slot)
	}
	s.owners[slot] = w
	l := res.Owned[0]
	return l.Epoch, w.Fence(l.Slot, l.Epoch), nil
}

func (s *stored) flush(subscription string, slot int, pos int64, fence eventsource.Fence) error {
	_, err := s.store.SaveCheckpoint(s.ctx, subscription, slot, pos, fence)
	if errors.Is(err, eventsource.ErrFenceLost) {
		return nil // a fenced-out write changes nothing, as for a reader
	}
	return err
}

func (s *stored) deadLetter(dl eventsource.DeadLetter) error {
	_, err := s.store.AddDeadLetter(s.ctx, dl)
	return err
}

func (s *stored) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, w := range s.workers {
		_ = w.Stop(ctx)
	}
}

// appended appends events to the kit's store (once per list of events:
// a second pass reuses them) and returns them as recorded.
func (k *Kit) appended(ctx context.Context, events []Event) ([]eventsource.RecordedEvent, error) {
	var key strings.Builder
	for i, e := range events {
		if _, _, err := k.check(i, e); err != nil {
			return nil, err
		}
		fmt.Fprintf(&key, "%s\x00%s\x00%v\x01", e.Stream, e.Type, e.Data)
	}
	if got, ok := k.given[key.String()]; ok {
		return got, nil
	}
	store := k.opts.Store
	ids := map[uuid.UUID]int{}
	for i, e := range events {
		_, data, _ := k.check(i, e)
		res, err := store.Append(ctx, e.Stream, eventsource.Any, []eventsource.EventData{{Type: e.Type, Data: data}})
		if err != nil {
			return nil, fmt.Errorf("kumitest: append event %d: %w", i, err)
		}
		ids[res.IDs[0]] = i
	}
	out := make([]eventsource.RecordedEvent, len(events))
	found := 0
	deadline := time.Now().Add(time.Minute)
	var from int64
	for found < len(events) {
		if _, err := store.Sequence(ctx); err != nil {
			return nil, fmt.Errorf("kumitest: sequence the events: %w", err)
		}
		page, err := store.ReadCategory(ctx, k.opts.Group.Category, from, 1000)
		if err != nil {
			return nil, fmt.Errorf("kumitest: read the events back: %w", err)
		}
		for _, e := range page {
			from = e.Position
			if i, ok := ids[e.ID]; ok {
				out[i] = e
				found++
			}
		}
		if len(page) == 0 && found < len(events) {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("kumitest: %d of %d events appended were not sequenced within a minute", len(events)-found, len(events))
			}
			select { // another process's sequencer may hold the row
			case <-time.After(5 * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	k.given[key.String()] = out
	return out, nil
}
