package actors

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/readfeed"
	"github.com/kumi-run/kumi/observability"
)

// publisherBatchSize is how many events the publisher reads per fetch, and
// publisherFetchBytes how many bytes (eventsource.RecordedEvent.Size): a
// fetch stops after the event that reaches it. It reads again at once
// after a full fetch. Between them, a fetch holds at most 4 MiB and one
// event, whatever the events' size: the fetch is shared by every reader's
// batch, and a reader's batch is part of it.
const (
	publisherBatchSize  = 1000
	publisherFetchBytes = 4 << 20
)

// liveBatch is what the publisher posts to one subscriber: every event of
// the subscriber's bucket with a global position in (From, To], in order.
// A reader that has covered less than From missed a batch (its queue
// overflowed) and catches up from the database.
type liveBatch struct {
	From, To int64
	// Epoch is the store's server epoch the positions belong to (see
	// publisher.epoch): a reader of another epoch does not take it.
	Epoch  int64
	Events []eventsource.RecordedEvent
	// Bytes is the events' total size, counted once by the publisher
	// against the reader's byte bounds (see OverflowBytes).
	Bytes int64
}

// subscribe registers a reader with the publisher. The first batch it gets
// starts at the publisher's position at the time it registered, which the
// publisher tells it first (subscribed).
type subscribe struct {
	PID      *actor.PID
	Category string
	Size     int
	Bucket   int
}

// subscribed tells a reader the position its subscription starts at: its
// batches bring the events after From, none at or before it, so its
// catch-up must read through From (see reader.onSubscribed). Epoch is the
// store's server epoch From belongs to: after a server change the
// publisher tells every reader again, from the new head (see
// publisher.restartEpoch).
type subscribed struct{ From, Epoch int64 }

type unsubscribe struct{ PID *actor.PID }

type publisherWake struct{}

// publisherPosition asks the publisher for its position (an int64 reply).
type publisherPosition struct{}

// inspectPublisher runs on the publisher's goroutine with the publisher
// (tests only: they order its messages through it).
type inspectPublisher func(*publisher, actor.Context)

type publisherFetched struct {
	inc      *publisher // the incarnation that fetched it (see fetched)
	epoch    int64      // the server epoch it was started in
	from, to int64
	events   []eventsource.RecordedEvent
	limit    int   // the events asked for
	bytes    int64 // the events' total size
	cheap    bool
	err      error
	// bound is the fetch's bound, and timedOut whether it failed for
	// running out of it.
	bound    time.Duration
	timedOut bool
}

type subscriber struct {
	sub  subscribe
	from int64 // every event of the subscriber in (from, pos] was posted to it
}

// publisher is the one actor per process that reads new events once per
// notification and fans them out to the subscribed readers' bounded queues.
// It never waits on a reader: a post applies the reader's overflow policy.
type publisher struct {
	store eventsource.PageReader
	// known is the head the notifier last announced: a fetch that is not
	// full covers it (see eventsource.PageReader).
	known func() int64
	// published is pos for the readers, stored before the batches up to
	// it are posted: a reader's catch-up covers it (see readfeed.Env.Published).
	// publishedEpoch is epoch for them, stored after published when it
	// changes: a reader that loads it, then published, and finds its own
	// server epoch, has a position of that epoch.
	published, publishedEpoch *atomic.Int64
	// server tells the store's server epoch (see eventsource.Store.Server).
	server func() eventsource.ServerEpoch
	wake   <-chan struct{}
	poll   time.Duration
	logger *slog.Logger
	tel    *telemetry

	pos int64
	// epoch is the store's server epoch pos belongs to. When the store
	// finds another server (a failover), positions of the last epoch mean
	// nothing: the publisher starts again from the new head (see
	// restartEpoch).
	epoch int64
	size  int64 // the average size of the events last fetched
	// subs is by PID id. It outlives the actor's restarts (see resync),
	// and restarted tells an incarnation that follows a restart.
	subs      map[string]*subscriber
	restarted bool
	index     map[string]map[int][][]*subscriber
	fetching  bool
	again     bool
	cancel    context.CancelFunc
	// fetchTimeout bounds a fetch; bound is the next fetch's bound: the
	// last one's doubled after a fetch that ran out of time, up to
	// maxFetchTimeout, back to fetchTimeout after one that landed. A read
	// that takes longer than fetchTimeout — an unreadable event's page on
	// a loaded server fails slowly, twice, before it is isolated — would
	// otherwise be cut off at the same point for ever, and the readers
	// that wait for the publisher with it.
	fetchTimeout, bound time.Duration
}

// publisherFetchTimeout is a publisher fetch's first bound;
// maxFetchTimeout the longest bound a fetch gets after fetches that ran
// out of time.
const (
	publisherFetchTimeout = 30 * time.Second
	maxFetchTimeout       = 8 * publisherFetchTimeout
)

// publisherOptions are what a publisher works with beside its reads.
type publisherOptions struct {
	// wake wakes it (it also reads every poll).
	wake <-chan struct{}
	poll time.Duration
	// known returns the head the notifier announced (nil: 0).
	known func() int64
	// published and publishedEpoch keep its position and the server
	// epoch it belongs to (nil: its own).
	published, publishedEpoch *atomic.Int64
	// server returns the store's server epoch (nil: never changes).
	server func() eventsource.ServerEpoch
	logger *slog.Logger
	tel    *telemetry
	// fetchTimeout is a fetch's first bound (0: publisherFetchTimeout).
	fetchTimeout time.Duration
}

// newPublisherProps makes the publisher: it reads through reads when
// woken (see publisherOptions).
func newPublisherProps(reads eventsource.PageReader, o publisherOptions) *actor.Props {
	if o.known == nil {
		o.known = func() int64 { return 0 }
	}
	if o.published == nil {
		o.published = new(atomic.Int64)
	}
	if o.publishedEpoch == nil {
		o.publishedEpoch = new(atomic.Int64)
	}
	if o.server == nil {
		o.server = func() eventsource.ServerEpoch { return eventsource.ServerEpoch{} }
	}
	if o.fetchTimeout <= 0 {
		o.fetchTimeout = publisherFetchTimeout
	}
	subs, incarnations := map[string]*subscriber{}, 0
	return actor.PropsFromProducer(func() actor.Actor {
		incarnations++ // on the actor's goroutine: the first start, then each restart
		return &publisher{store: reads, known: o.known, published: o.published, publishedEpoch: o.publishedEpoch,
			server: o.server, wake: o.wake, poll: o.poll, logger: o.logger, tel: o.tel, subs: subs, restarted: incarnations > 1,
			fetchTimeout: o.fetchTimeout, bound: o.fetchTimeout}
	})
}

// publisherReset is the head read for a new server epoch (see
// restartEpoch).
type publisherReset struct {
	inc   *publisher
	epoch int64
	head  int64
	err   error
}

func (p *publisher) Receive(ctx actor.Context) {
	switch msg := ctx.Message().(type) {
	case *actor.Started:
		p.start(ctx)
	case *actor.Stopping, *actor.Restarting:
		if p.cancel != nil {
			p.cancel()
		}
	case *subscribe:
		if _, ok := p.subs[msg.PID.Id]; !ok {
			ctx.Watch(msg.PID)
		}
		p.subs[msg.PID.Id] = &subscriber{sub: *msg, from: p.pos}
		p.index = nil
		ctx.Send(msg.PID, &subscribed{From: p.pos, Epoch: p.epoch})
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
	case *publisherReset:
		p.onReset(ctx, msg)
	case inspectPublisher:
		msg(p, ctx)
	}
}

func (p *publisher) start(ctx actor.Context) {
	bg, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	self, root := ctx.Self(), ctx.ActorSystem().Root
	if p.restarted {
		p.resync(ctx)
	} else {
		p.epoch = p.server().Epoch // before the head: a change between them shows at the next fetch
		head, err := p.store.HeadPosition(bg)
		if err != nil {
			p.logger.Warn("kumi: publisher could not read the head position; starting from 0", "err", err)
		}
		p.setPos(head)
		p.publishedEpoch.Store(p.epoch)
	}
	go func() {
		t := time.NewTicker(p.poll)
		defer t.Stop()
		for {
			select {
			case <-bg.Done():
				return
			case <-p.wake:
			case <-t.C:
			case <-p.server().Changed:
			}
			root.Send(self, publisherWake{})
		}
	}()
}

// resync starts an incarnation that follows a restart (a panic) where
// the last one left the readers: at the position it last published, every
// subscriber's batches starting there, and each subscriber told so
// (subscribed), so that it reads from the store whatever the failed
// incarnation did not post to it — a broadcast cut short, a batch of a
// fetch it never took — before it takes those batches. The readers are
// watched still: a watch is the watched actor's.
func (p *publisher) resync(ctx actor.Context) {
	p.pos, p.epoch = p.published.Load(), p.publishedEpoch.Load()
	p.retell(ctx)
	p.logger.Warn("kumi: the publisher restarted; its readers read from the store what it may not have posted them",
		"position", p.pos, "readers", len(p.subs))
	p.fetch(ctx)
}

// retell starts every subscriber's batches at pos, and tells it so.
func (p *publisher) retell(ctx actor.Context) {
	p.index = nil
	for _, s := range p.subs {
		s.from = p.pos
		ctx.Send(s.sub.PID, &subscribed{From: p.pos, Epoch: p.epoch})
	}
}

// fetch starts one read unless one is under way, in which case it asks for
// another when that one ends. In a new server epoch it reads the head
// instead (see restartEpoch).
func (p *publisher) fetch(ctx actor.Context) {
	if p.fetching {
		p.again = true
		return
	}
	if epoch := p.server().Epoch; epoch != p.epoch {
		p.restartEpoch(ctx, epoch)
		return
	}
	p.fetching, p.again = true, false
	self, root, from, known := ctx.Self(), ctx.ActorSystem().Root, p.pos, p.known()
	cheap, subscribers := len(p.subs) == 0, len(p.subs)
	limit := readfeed.FetchLimit(publisherBatchSize, publisherFetchBytes, p.size)
	bound := p.bound
	go func() {
		c, cancel := context.WithTimeout(context.Background(), bound)
		defer cancel()
		res := p.read(c, from, known, cheap, limit, subscribers)
		res.bound, res.timedOut = bound, res.err != nil && errors.Is(c.Err(), context.DeadlineExceeded)
		root.Send(self, res)
	}()
}

// read is one fetch after from, off the mailbox: the head alone (cheap),
// or the events, up to limit.
func (p *publisher) read(c context.Context, from, known int64, cheap bool, limit, subscribers int) *publisherFetched {
	res := &publisherFetched{inc: p, epoch: p.epoch, from: from, cheap: cheap, limit: limit}
	if cheap {
		res.to, res.err = p.store.HeadPosition(c)
		return res
	}
	var span observability.FetchSpan
	c, span = p.tel.startFetch(c, from, subscribers)
	res.events, res.err = p.store.ReadAllPage(c, eventsource.Page{After: from, Known: known, Limit: limit, MaxBytes: publisherFetchBytes})
	res.to = from
	if n := len(res.events); n > 0 {
		res.to = res.events[n-1].Position
		res.bytes = readfeed.SizeOf(res.events)
	}
	span.End(len(res.events), res.to, res.err)
	return res
}

func (p *publisher) fetched(ctx actor.Context, f *publisherFetched) {
	if f.inc != p {
		return // a fetch of the incarnation before a restart: resync covered it
	}
	p.fetching = false
	switch {
	case f.epoch != p.epoch || p.server().Epoch != p.epoch:
		// Read in an epoch that is over, perhaps on the new server from a
		// position of the old: fetch starts the new one.
		p.again = true
	case f.err != nil:
		if f.timedOut {
			p.bound = min(2*f.bound, maxFetchTimeout)
		}
		p.logger.Warn("kumi: publisher fetch failed; retrying on the next wake-up", "err", f.err, "next_bound", p.bound)
	case f.cheap && len(p.subs) > 0:
		// A reader subscribed while the tail was read without payloads:
		// read the range in full instead, so it misses nothing.
		p.again = true
	case f.cheap:
		p.bound = p.fetchTimeout
		p.setPos(max(p.pos, f.to))
	default:
		p.bound = p.fetchTimeout
		for _, e := range f.events {
			if e.Err != nil {
				p.logger.Warn("kumi: publisher read an event the store cannot give back; its bucket's readers dead-letter it",
					"event_id", e.ID, "stream", e.Stream, "position", e.Position, "err", e.Err)
			}
		}
		p.setPos(f.to)
		p.broadcast(ctx, f)
		if n := int64(len(f.events)); n > 0 {
			p.size = f.bytes / n
		}
		if len(f.events) >= f.limit || f.bytes >= publisherFetchBytes {
			p.again = true // a full fetch: more may follow
		}
	}
	if p.again {
		p.fetch(ctx)
	}
}

// restartEpoch starts the publisher's new server epoch: once it has read
// the new server's head, it publishes from there (see onReset). What it
// posted before came from positions of the last server, which may be
// handed out again to other events.
func (p *publisher) restartEpoch(ctx actor.Context, epoch int64) {
	p.fetching, p.again = true, false
	self, root := ctx.Self(), ctx.ActorSystem().Root
	go func() {
		c, cancel := context.WithTimeout(context.Background(), publisherFetchTimeout)
		defer cancel()
		head, err := p.store.HeadPosition(c)
		root.Send(self, &publisherReset{inc: p, epoch: epoch, head: head, err: err})
	}()
}

// onReset moves the publisher to the new server epoch at its head, and
// tells every subscriber: a reader of an earlier epoch starts again from
// its checkpoint (see reader.newEpoch), one of this epoch reads through
// the head from the store.
func (p *publisher) onReset(ctx actor.Context, m *publisherReset) {
	if m.inc != p {
		return
	}
	p.fetching = false
	if m.err != nil {
		p.logger.Warn("kumi: the publisher could not read the new server's head; retrying on the next wake-up",
			"server_epoch", m.epoch, "err", m.err)
	} else {
		before := p.pos
		p.epoch = m.epoch
		p.setPos(m.head)
		p.publishedEpoch.Store(m.epoch)
		p.retell(ctx)
		p.logger.Info("kumi: the publisher starts again from the new server's head", "server_epoch", m.epoch,
			"position_before", before, "head", m.head, "readers", len(p.subs))
	}
	if p.again {
		p.fetch(ctx)
	}
}

// setPos moves the publisher's position, and published with it.
func (p *publisher) setPos(pos int64) {
	p.pos = pos
	p.published.Store(pos)
}

func (p *publisher) broadcast(ctx actor.Context, f *publisherFetched) {
	if len(f.events) == 0 {
		return
	}
	if p.index == nil {
		p.buildIndex()
	}
	out := map[*subscriber]*liveBatch{}
	for i := range f.events {
		e := &f.events[i]
		bySize := p.index[e.Category]
		for size, buckets := range bySize {
			for _, s := range buckets[eventsource.BucketOfHash(e.Hash, size)] {
				b := out[s]
				if b == nil {
					b = &liveBatch{From: s.from, To: f.to, Epoch: p.epoch}
					out[s] = b
				}
				b.Events = append(b.Events, *e)
				b.Bytes += e.Size()
			}
		}
	}
	for s, b := range out {
		ctx.Send(s.sub.PID, b)
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
		bySize[s.sub.Size][s.sub.Bucket] = append(bySize[s.sub.Size][s.sub.Bucket], s)
	}
}
