package eventsource

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	retry "github.com/kumi-run/kumi/internal/backoff"
	"github.com/kumi-run/kumi/internal/startstop"
	"github.com/kumi-run/kumi/kumierr"
)

// Defaults for [NotifierOptions].
const (
	NotifierPollIntervalDefault = time.Second
	NotifierReconnectMinDefault = 100 * time.Millisecond
	NotifierReconnectMaxDefault = 10 * time.Second
	NotifierPingIntervalDefault = 30 * time.Second
	maxChannelNameLength        = 63
	notifierDialTimeout         = 10 * time.Second
)

// Probe is a [Notifier]'s safety poll for one channel: it returns a value
// that never decreases (a head position, a change counter). When it
// returns more than the channel has announced, a notification was lost or
// is late, and the channel's listeners are woken.
type Probe func(ctx context.Context) (int64, error)

// NotifierOptions configure a [Notifier]. Zero values mean defaults.
type NotifierOptions struct {
	// Channels to LISTEN on from the start. At least one; each 1 to 63
	// bytes of UTF-8 without NUL. [Notifier.Listen] adds more later.
	Channels []string
	// Probes are the safety polls, by channel; a channel without one is
	// woken only by notifications and reconnections.
	Probes map[string]Probe
	// PollInterval is how often the probes run. Default 1 s; negative
	// disables them.
	PollInterval time.Duration
	// ReconnectMin and ReconnectMax bound the exponential backoff, with
	// jitter, between attempts to reconnect. Defaults 100 ms and 10 s.
	ReconnectMin, ReconnectMax time.Duration
	// PingInterval is how long the connection may stay silent before it is
	// pinged, to notice a connection that died without a word. Default 30 s.
	PingInterval time.Duration
	// Logger receives connection losses at Warn; nil discards.
	Logger *slog.Logger
	// OnReconnect, if set, is called each time the connection is lost and
	// the notifier starts to reconnect (for metrics). It must not block.
	OnReconnect func(err error)
}

// WithDefaults returns o with zero fields set to their defaults.
func (o NotifierOptions) WithDefaults() NotifierOptions {
	if o.PollInterval == 0 {
		o.PollInterval = NotifierPollIntervalDefault
	}
	if o.ReconnectMin <= 0 {
		o.ReconnectMin = NotifierReconnectMinDefault
	}
	if o.ReconnectMax <= 0 {
		o.ReconnectMax = max(NotifierReconnectMaxDefault, o.ReconnectMin)
	}
	if o.PingInterval <= 0 {
		o.PingInterval = NotifierPingIntervalDefault
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

// checkChannel returns what is wrong with c as a channel name, or "".
func checkChannel(c string) string {
	if c == "" || len(c) > maxChannelNameLength || !utf8.ValidString(c) {
		return fmt.Sprintf("must be 1 to %d bytes of UTF-8", maxChannelNameLength)
	}
	if strings.ContainsRune(c, 0) {
		return "contains NUL"
	}
	return ""
}

func (o NotifierOptions) validate() error {
	if len(o.Channels) == 0 {
		return &kumierr.ConfigError{Field: "eventsource.NotifierOptions.Channels", Reason: "is empty: give at least one channel"}
	}
	for _, c := range o.Channels {
		if reason := checkChannel(c); reason != "" {
			return &kumierr.ConfigError{Field: "eventsource.NotifierOptions.Channels", Value: c, Reason: reason}
		}
	}
	for c, p := range o.Probes {
		if !slices.Contains(o.Channels, c) {
			return &kumierr.ConfigError{Field: "eventsource.NotifierOptions.Probes", Value: c, Reason: "probes a channel that is not in Channels"}
		}
		if p == nil {
			return &kumierr.ConfigError{Field: "eventsource.NotifierOptions.Probes", Value: c, Reason: "the channel's probe is nil"}
		}
	}
	if o.ReconnectMax < o.ReconnectMin {
		return &kumierr.ConfigError{Field: "eventsource.NotifierOptions.ReconnectMax", Value: o.ReconnectMax, Reason: fmt.Sprintf("is less than ReconnectMin (%v)", o.ReconnectMin)}
	}
	return nil
}

// Notifier keeps one dedicated LISTEN connection (not a pool connection)
// for a process and wakes the listeners of each channel when a
// notification arrives, when the channel is listened on afresh (on the
// first connection, after every reconnection, and when [Notifier.Listen]
// adds it), and when a channel's [Probe] shows that a notification went
// missing. Wake-ups are ticks on a channel of capacity 1, so a burst of
// notifications coalesces into one: a listener that wakes re-reads from
// its own cursor. Channels can be added while it runs, so every part of a
// process (the runtime's publisher, each group's lease store) shares the
// one connection.
//
// A lost connection (a restarted server, a network fault) is retried with
// exponential backoff and jitter, without limit, until [Notifier.Stop]. Its
// Start and Stop follow kumi's lifecycle contract (docs/design/architecture.md,
// "Lifecycle").
type Notifier struct {
	pool *pgxpool.Pool
	opts NotifierOptions

	chMu  sync.Mutex // guards chans and interrupt
	chans map[string]*notifyChannelState
	// interrupt ends the live connection's wait for a notification, so
	// that it LISTENs on a channel just added; nil when not waiting.
	interrupt context.CancelFunc

	life startstop.Lifecycle

	connected                          atomic.Bool
	connects, notifications, pollTicks atomic.Int64
	serverChanges                      atomic.Int64

	// store is the store whose channel the notifier serves (set by
	// Store.NewNotifier), told what each connection finds; server is the
	// identity of the last connection's server, and epoch the store's
	// epoch then (see identify). Only the listen loop uses them.
	store       *Store
	server      ServerIdentity
	serverKnown bool
	epoch       int64
}

type notifyChannelState struct {
	name   string
	latest atomic.Int64

	mu        sync.Mutex
	listeners map[*Listener]struct{}
	listening bool // LISTEN is in place on the live connection
}

func newChannelState(name string) *notifyChannelState {
	return &notifyChannelState{name: name, listeners: map[*Listener]struct{}{}}
}

// NewNotifier returns a notifier on pool's database, not started: it connects
// with pool's connection settings, but on a connection of its own.
func NewNotifier(pool *pgxpool.Pool, opts NotifierOptions) (*Notifier, error) {
	if pool == nil {
		return nil, &kumierr.ConfigError{Field: "eventsource pool", Reason: "is nil"}
	}
	opts = opts.WithDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.Channels = slices.Clone(opts.Channels)
	opts.Probes = maps.Clone(opts.Probes)
	n := &Notifier{pool: pool, opts: opts, chans: map[string]*notifyChannelState{}}
	for _, c := range opts.Channels {
		n.chans[c] = newChannelState(c)
	}
	return n, nil
}

// NewNotifier returns a notifier on the store's database, not started, that
// listens on [Store.NotifyChannel], with [Store.HeadPosition] as its
// probe, besides whatever opts adds; [Notifier.Listen] adds more while it
// runs (each lease store its rebalance channel), so that a process needs
// one LISTEN connection in all.
func (s *Store) NewNotifier(opts NotifierOptions) (*Notifier, error) {
	ch := s.NotifyChannel()
	if !slices.Contains(opts.Channels, ch) {
		opts.Channels = append(slices.Clone(opts.Channels), ch)
	}
	if _, ok := opts.Probes[ch]; !ok {
		opts.Probes = maps.Clone(opts.Probes)
		if opts.Probes == nil {
			opts.Probes = map[string]Probe{}
		}
		opts.Probes[ch] = s.HeadPosition
	}
	n, err := NewNotifier(s.pool, opts)
	if n != nil {
		n.store = s
	}
	return n, err
}

// Listener receives a channel's wake-ups. Create one with
// [Notifier.Listen]; Close it when done.
type Listener struct {
	ch   *notifyChannelState
	c    chan struct{}
	keep func(payload string) bool // nil keeps every notification
}

// Listen returns a new listener on channel. It may be called before or
// after Start, and from any goroutine. A channel that is not yet the
// notifier's is added: a running notifier LISTENs on it on its live
// connection at once, and on every connection after. The new listener is
// woken once the channel is listened on (at once if it already is), since
// notifications sent before may have been missed; then as described at
// [Notifier]. A channel stays listened on until the notifier stops, even
// when its last listener closes. The error is a *[kumierr.ConfigError] for a
// channel that is not 1 to 63 bytes of UTF-8 without NUL.
func (n *Notifier) Listen(channel string) (*Listener, error) {
	return n.ListenFiltered(channel, nil)
}

// ListenFiltered is [Notifier.Listen] with a filter on notifications: one
// wakes the listener only when keep returns true for its payload (a worker
// skips its own announcements, say). Every other wake-up (the channel
// listened on afresh, a probe) is not filtered. keep runs on the
// notifier's goroutine, for each notification on the channel: it must be
// quick and must not call the notifier. A nil keep keeps everything.
func (n *Notifier) ListenFiltered(channel string, keep func(payload string) bool) (*Listener, error) {
	if reason := checkChannel(channel); reason != "" {
		return nil, &kumierr.ConfigError{Field: "eventsource channel", Value: channel, Reason: reason}
	}
	n.chMu.Lock()
	st, ok := n.chans[channel]
	if !ok {
		st = newChannelState(channel)
		n.chans[channel] = st
		if n.interrupt != nil {
			n.interrupt() // the live connection LISTENs on it now
		}
	}
	n.chMu.Unlock()
	l := &Listener{ch: st, c: make(chan struct{}, 1), keep: keep}
	st.mu.Lock()
	st.listeners[l] = struct{}{}
	if st.listening {
		l.c <- struct{}{}
	}
	st.mu.Unlock()
	return l, nil
}

// C returns the listener's wake-up channel: capacity 1, never closed. A
// tick means "look again"; ticks may be spurious, never lost.
func (l *Listener) C() <-chan struct{} { return l.c }

// Latest returns the highest integer seen on the channel, from
// notification payloads and the probe: for the store's channel, the head
// position. 0 until one is seen.
func (l *Listener) Latest() int64 { return l.ch.latest.Load() }

// Close stops the listener's wake-ups. It is idempotent.
func (l *Listener) Close() {
	l.ch.mu.Lock()
	delete(l.ch.listeners, l)
	l.ch.mu.Unlock()
}

// record raises the channel's latest value to v if it is more.
func (st *notifyChannelState) record(v int64) {
	for {
		cur := st.latest.Load()
		if v <= cur || st.latest.CompareAndSwap(cur, v) {
			return
		}
	}
}

// wake wakes the channel's listeners: for a notification (payload not
// nil), those whose filter keeps it; otherwise all.
func (st *notifyChannelState) wake(payload *string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.wakeLocked(payload)
}

func (st *notifyChannelState) wakeLocked(payload *string) {
	for l := range st.listeners {
		if payload != nil && l.keep != nil && !l.keep(*payload) {
			continue
		}
		select {
		case l.c <- struct{}{}:
		default:
		}
	}
}

// setListening records whether LISTEN is in place on the live connection;
// once it is, every listener is woken, in the same step, so that a
// listener added meanwhile is woken once, not twice.
func (st *notifyChannelState) setListening(on bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.listening = on
	if on {
		// Notifications sent while no connection listened are lost:
		// everyone looks again.
		st.wakeLocked(nil)
	}
}

// channel returns the state of channel, or nil.
func (n *Notifier) channel(channel string) *notifyChannelState {
	n.chMu.Lock()
	defer n.chMu.Unlock()
	return n.chans[channel]
}

// Latest returns the highest integer seen on channel (see
// [Listener.Latest]); 0 for a channel that is not the notifier's.
func (n *Notifier) Latest(channel string) int64 {
	if st := n.channel(channel); st != nil {
		return st.latest.Load()
	}
	return 0
}

// NotifierStats are a notifier's counters, for metrics and tests.
type NotifierStats struct {
	// Connected reports that the LISTEN connection is up and listening.
	Connected bool
	// Connects counts successful connections; Connects-1 are reconnections.
	Connects int64
	// Notifications counts notifications received.
	Notifications int64
	// PollTicks counts wake-ups raised by a probe: notifications that went
	// missing or came late.
	PollTicks int64
	// ServerChanges counts the connections made to another server than
	// the one before (a failover: see [ServerIdentity]), after which every
	// channel's latest value was forgotten.
	ServerChanges int64
}

// Stats returns the notifier's counters.
func (n *Notifier) Stats() NotifierStats {
	return NotifierStats{
		Connected:     n.connected.Load(),
		Connects:      n.connects.Load(),
		Notifications: n.notifications.Load(),
		PollTicks:     n.pollTicks.Load(),
		ServerChanges: n.serverChanges.Load(),
	}
}

// Start connects and listens in the background until [Notifier.Stop]. It
// returns at once, without waiting for the connection (see
// [NotifierStats].Connected). It follows kumi's lifecycle contract
// (docs/design/architecture.md, "Lifecycle"): ctx bounds starting only, never the
// notifier's life; a second Start does nothing, and after Stop it returns
// [kumierr.ErrStopped].
func (n *Notifier) Start(ctx context.Context) error {
	return n.life.Start(ctx, func(context.Context) error {
		n.life.Go(n.listenLoop)
		n.life.Go(n.pollLoop)
		return nil
	})
}

// Stop stops the notifier and waits for its goroutines and connection to
// end, or returns ctx.Err() if ctx ends first (they still end soon after).
// It is idempotent and safe on a notifier never started.
func (n *Notifier) Stop(ctx context.Context) error { return n.life.Stop(ctx, nil) }

func (n *Notifier) listenLoop(ctx context.Context) {
	defer n.connected.Store(false)
	attempt := 0
	for ctx.Err() == nil {
		conn, err := n.connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			n.opts.Logger.Warn("kumi: notifier cannot connect", "err", err, "attempt", attempt+1)
			if !retry.Sleep(ctx, backoff(n.opts.ReconnectMin, n.opts.ReconnectMax, attempt)) {
				return
			}
			attempt++
			continue
		}
		attempt = 0
		n.connects.Add(1)
		n.connected.Store(true)
		err = n.receive(ctx, conn)
		n.connected.Store(false)
		n.unlisten()
		closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		n.opts.Logger.Warn("kumi: notifier lost its connection; reconnecting", "err", err)
		if n.opts.OnReconnect != nil {
			n.opts.OnReconnect(err)
		}
		if !retry.Sleep(ctx, backoff(n.opts.ReconnectMin, n.opts.ReconnectMax, 0)) {
			return
		}
	}
}

// connect opens the dedicated connection and LISTENs on every channel.
func (n *Notifier) connect(ctx context.Context) (*pgx.Conn, error) {
	dialCtx, cancel := context.WithTimeout(ctx, notifierDialTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(dialCtx, n.pool.Config().ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if err := n.identify(dialCtx, conn); err != nil {
		_ = conn.Close(context.WithoutCancel(dialCtx))
		return nil, err
	}
	if err := n.listenNew(ctx, conn); err != nil {
		n.unlisten()
		_ = conn.Close(context.WithoutCancel(dialCtx))
		return nil, err
	}
	return conn, nil
}

// identify reads the identity of conn's server before it listens. When
// it is another server than the last connection's, or the store has found
// a change since then (its sequencer, say), every channel's latest value
// is forgotten: the new server's head may be below the old one's, and a
// latest that only grows would hide the positions it hands out again,
// for a probe raises it only past its value. The listeners are woken when
// the channels are listened on, as after every connection.
func (n *Notifier) identify(ctx context.Context, conn *pgx.Conn) error {
	id, err := serverIdentity(ctx, conn)
	if err != nil {
		return err
	}
	changed := n.serverKnown && id.differs(n.server)
	if n.store != nil {
		n.store.observeServer(id, -1, 0, 0)
		epoch := n.store.Server().Epoch
		changed = changed || n.serverKnown && epoch != n.epoch
		n.epoch = epoch
	}
	if changed {
		n.serverChanges.Add(1)
		n.chMu.Lock()
		for _, st := range n.chans {
			st.latest.Store(0)
		}
		n.chMu.Unlock()
		n.opts.Logger.Info("kumi: notifier connected to another server: it forgot the channels' latest values",
			"old", n.server.String(), "new", id.String())
	}
	n.server, n.serverKnown = id, true
	return nil
}

// listenNew LISTENs on conn on every channel not yet listened on, waking
// each one's listeners.
func (n *Notifier) listenNew(ctx context.Context, conn *pgx.Conn) error {
	n.chMu.Lock()
	var todo []*notifyChannelState
	for _, st := range n.chans {
		st.mu.Lock()
		if !st.listening {
			todo = append(todo, st)
		}
		st.mu.Unlock()
	}
	n.chMu.Unlock()
	for _, st := range todo {
		listenCtx, cancel := context.WithTimeout(ctx, notifierDialTimeout)
		_, err := conn.Exec(listenCtx, listen(st.name))
		cancel()
		if err != nil {
			return fmt.Errorf("listen %q: %w", st.name, err)
		}
		st.setListening(true)
	}
	return nil
}

// unlisten records that no channel is listened on: the connection is gone.
func (n *Notifier) unlisten() {
	n.chMu.Lock()
	defer n.chMu.Unlock()
	for _, st := range n.chans {
		st.setListening(false)
	}
}

// waitFor returns a context for the next wait for a notification, which
// [Notifier.ListenFiltered] cancels when it adds a channel; ok is false
// (and the context nil) when a channel is waiting to be listened on.
func (n *Notifier) waitFor(ctx context.Context) (waitCtx context.Context, cancel context.CancelFunc, ok bool) {
	n.chMu.Lock()
	defer n.chMu.Unlock()
	for _, st := range n.chans {
		st.mu.Lock()
		pending := !st.listening
		st.mu.Unlock()
		if pending {
			return nil, nil, false
		}
	}
	waitCtx, cancel = context.WithTimeout(ctx, n.opts.PingInterval)
	n.interrupt = cancel
	return waitCtx, cancel, true
}

// receive delivers notifications until the connection fails or ctx ends,
// LISTENing on channels as they are added. A silent connection is pinged
// every PingInterval.
func (n *Notifier) receive(ctx context.Context, conn *pgx.Conn) error {
	for {
		waitCtx, cancel, ok := n.waitFor(ctx)
		if !ok {
			if err := n.listenNew(ctx, conn); err != nil {
				return err
			}
			continue
		}
		note, err := conn.WaitForNotification(waitCtx)
		n.chMu.Lock()
		n.interrupt = nil
		n.chMu.Unlock()
		timedOut := errors.Is(waitCtx.Err(), context.DeadlineExceeded)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if conn.IsClosed() || !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				return err
			}
			if !timedOut {
				continue // interrupted: a channel was added
			}
			pingCtx, cancel := context.WithTimeout(ctx, notifierDialTimeout)
			err = conn.Ping(pingCtx)
			cancel()
			if err != nil {
				return fmt.Errorf("ping: %w", err)
			}
			continue
		}
		n.notifications.Add(1)
		if st := n.channel(note.Channel); st != nil {
			if v, err := strconv.ParseInt(note.Payload, 10, 64); err == nil {
				st.record(v)
			}
			st.wake(&note.Payload)
		}
	}
}

// pollLoop runs the probes every PollInterval.
func (n *Notifier) pollLoop(ctx context.Context) {
	if n.opts.PollInterval < 0 || len(n.opts.Probes) == 0 {
		return
	}
	t := time.NewTicker(n.opts.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for c, probe := range n.opts.Probes {
			st := n.channel(c)
			probeCtx, cancel := context.WithTimeout(ctx, max(n.opts.PollInterval, time.Second))
			v, err := probe(probeCtx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					n.opts.Logger.Debug("kumi: notifier probe failed", "channel", c, "err", err)
				}
				continue
			}
			if v > st.latest.Load() {
				n.pollTicks.Add(1)
				st.record(v)
				st.wake(nil)
			}
		}
	}
}

// backoff returns the wait before retry number attempt (from 0):
// exponential from lo, capped at hi, with equal jitter (uniform in
// [d/2, d]) so that many processes cut off at once do not reconnect in
// step. It is kumi's one backoff (internal/backoff), which supervision uses
// too.
func backoff(lo, hi time.Duration, attempt int) time.Duration {
	return retry.Policy{Initial: lo, Max: hi, Multiplier: 2, Jitter: retry.Equal}.Next(attempt + 1)
}
