package actors

import (
	"context"
	"log/slog"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/observability"
)

// publisherBatchSize is how many events the publisher reads per fetch. It
// reads again at once after a full batch.
const publisherBatchSize = 1000

// liveBatch is what the publisher posts to one subscriber: every event of
// the subscriber's bucket with a global position in (From, To], in order.
// A reader that has covered less than From missed a batch (its queue
// overflowed) and catches up from the database.
type liveBatch struct {
	From, To int64
	Events   []eventsource.RecordedEvent
}

// subscribe registers a reader with the publisher. The first batch it gets
// starts at the publisher's position at the time it registered.
type subscribe struct {
	PID      *actor.PID
	Category string
	Size     int
	Member   int
}

type unsubscribe struct{ PID *actor.PID }

type publisherWake struct{}

// publisherPosition asks the publisher for its position (an int64 reply).
type publisherPosition struct{}

type publisherFetched struct {
	from, to int64
	events   []eventsource.RecordedEvent
	cheap    bool
	err      error
}

type subscriber struct {
	sub  subscribe
	from int64 // every event of the subscriber in (from, pos] was posted to it
}

// publisher is the one actor per process that reads new events once per
// notification and fans them out to the subscribed readers' bounded queues.
// It never waits on a reader: a post applies the reader's overflow policy.
type publisher struct {
	store  *eventsource.Store
	wake   <-chan struct{}
	poll   time.Duration
	logger *slog.Logger
	tel    *telemetry

	pos      int64
	subs     map[string]*subscriber // by PID id
	index    map[string]map[int][][]*subscriber
	fetching bool
	again    bool
	cancel   context.CancelFunc
}

func newPublisherProps(store *eventsource.Store, wake <-chan struct{}, poll time.Duration, logger *slog.Logger, tel *telemetry) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor {
		return &publisher{store: store, wake: wake, poll: poll, logger: logger, tel: tel, subs: map[string]*subscriber{}}
	})
}

func (p *publisher) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		p.start(ctx)
	case *actor.Stopping:
		if p.cancel != nil {
			p.cancel()
		}
	case *subscribe:
		if _, ok := p.subs[msg.PID.Id]; !ok {
			ctx.Watch(msg.PID)
		}
		p.subs[msg.PID.Id] = &subscriber{sub: *msg, from: p.pos}
		p.index = nil
		p.fetch(ctx)
	case *unsubscribe:
		ctx.Unwatch(msg.PID)
		delete(p.subs, msg.PID.Id)
		p.index = nil
	case *actor.Terminated:
		delete(p.subs, msg.Who.Id)
		p.index = nil
	case publisherWake:
		p.fetch(ctx)
	case *publisherPosition:
		ctx.Respond(p.pos)
	case *publisherFetched:
		p.fetched(ctx, msg)
	}
}

func (p *publisher) start(ctx actor.Context) {
	bg, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	self, root := ctx.Self(), ctx.ActorSystem().Root
	head, err := p.store.HeadPosition(bg)
	if err != nil {
		p.logger.Warn("kumi: publisher could not read the head position; starting from 0", "err", err)
	}
	p.pos = head
	go func() {
		t := time.NewTicker(p.poll)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-p.wake:
			case <-t.C:
			}
			root.Send(self, publisherWake{})
		}
	}()
}

// fetch starts one read unless one is under way, in which case it asks for
// another when that one ends.
func (p *publisher) fetch(ctx actor.Context) {
	if p.fetching {
		p.again = true
		return
	}
	p.fetching, p.again = true, false
	self, root, from := ctx.Self(), ctx.ActorSystem().Root, p.pos
	cheap, subscribers := len(p.subs) == 0, len(p.subs)
	go func() {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res := &publisherFetched{from: from, cheap: cheap}
		if cheap {
			res.to, res.err = p.store.HeadPosition(c)
		} else {
			var span observability.FetchSpan
			c, span = p.tel.startFetch(c, from, subscribers)
			res.events, res.err = p.store.ReadAll(c, from, publisherBatchSize)
			res.to = from
			if n := len(res.events); n > 0 {
				res.to = res.events[n-1].Position
			}
			span.End(len(res.events), res.to, res.err)
		}
		root.Send(self, res)
	}()
}

func (p *publisher) fetched(ctx actor.Context, f *publisherFetched) {
	p.fetching = false
	switch {
	case f.err != nil:
		p.logger.Warn("kumi: publisher fetch failed; retrying on the next wake-up", "err", f.err)
	case f.cheap && len(p.subs) > 0:
		// A reader subscribed while the tail was read without payloads:
		// read the range in full instead, so it misses nothing.
		p.again = true
	case f.cheap:
		p.pos = max(p.pos, f.to)
	default:
		for _, e := range f.events {
			if e.Err != nil {
				p.logger.Warn("kumi: publisher read an event the store cannot give back; its bucket's readers dead-letter it",
					"event_id", e.ID, "stream", e.Stream, "position", e.Position, "err", e.Err)
			}
		}
		p.broadcast(ctx, f)
		p.pos = f.to
		if len(f.events) >= publisherBatchSize {
			p.again = true
		}
	}
	if p.again {
		p.fetch(ctx)
	}
}

func (p *publisher) broadcast(ctx actor.Context, f *publisherFetched) {
	if len(f.events) == 0 {
		return
	}
	if p.index == nil {
		p.buildIndex()
	}
	out := map[*subscriber][]eventsource.RecordedEvent{}
	for _, e := range f.events {
		bySize := p.index[e.Category]
		for size, members := range bySize {
			for _, s := range members[eventsource.Member(e.Hash, size)] {
				out[s] = append(out[s], e)
			}
		}
	}
	for s, events := range out {
		ctx.Send(s.sub.PID, &liveBatch{From: s.from, To: f.to, Events: events})
		s.from = f.to
	}
}

func (p *publisher) buildIndex() {
	p.index = map[string]map[int][][]*subscriber{}
	for _, s := range p.subs {
		bySize := p.index[s.sub.Category]
		if bySize == nil {
			bySize = map[int][][]*subscriber{}
			p.index[s.sub.Category] = bySize
		}
		if bySize[s.sub.Size] == nil {
			bySize[s.sub.Size] = make([][]*subscriber, s.sub.Size)
		}
		bySize[s.sub.Size][s.sub.Member] = append(bySize[s.sub.Size][s.sub.Member], s)
	}
}
