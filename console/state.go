package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

// maxPendingCount bounds the pending dead letters counted per look; more
// are shown as "1000+".
const maxPendingCount = 1000

// subState is what /api/s/{sub} returns: one subscription at one moment, and
// its last ownership changes.
type subState struct {
	Subscription string       `json:"subscription"`
	Category     string       `json:"category,omitempty"` // from Options.Categories; "" when unknown
	Now          time.Time    `json:"now"`                // the database's clock
	Head         int64        `json:"head"`               // the store's last sequenced position
	Buckets      int          `json:"bucket_count"`       // N; 0 before any worker started it
	LiveWorkers  int          `json:"live_workers"`
	Workers      []workerView `json:"workers"` // by worker id
	Rows         []bucketView `json:"buckets"` // by bucket
	// PendingLetters counts pending dead letters, up to 1000 (then
	// PendingMore is set).
	PendingLetters int  `json:"pending_dead_letters"`
	PendingMore    bool `json:"pending_dead_letters_more"`
	// Timeline is the subscription's last ownership changes, newest
	// first, from the ownership record, which keeps them from
	// WatchingSince (its retention) on.
	Timeline      []changeView `json:"timeline"`
	WatchingSince time.Time    `json:"watching_since"`
	Actions       actionsView  `json:"actions"`
	// Generation is the serving generation (0 until a resize completes);
	// Buckets and Rows are its buckets.
	Generation int `json:"generation"`
	// Resize is the resize in progress (docs/design/resize.md); null when none.
	Resize *resizeView `json:"resize"`
	// Series is what the console's looks saw over the last hour, a point
	// per 10 s, oldest first, for the charts of lag and append rate: kept
	// in memory while the console runs (the tables keep no such history).
	Series []seriesPoint `json:"series"`
	// Failovers are the schema's failovers of the last week that handed
	// positions out again (eventsource.Store.ServerChanges), newest first:
	// handlers may have seen events that no longer exist.
	Failovers []failoverView `json:"failovers"`
	// Parked are the subscription's parked streams (docs/design/parking.md),
	// by stream, the first inspect.MaxParkedShown (then ParkedMore).
	Parked     []parkedView `json:"parked_streams"`
	ParkedMore bool         `json:"parked_streams_more"`
}

// parkedView is a parked stream: its later events wait, in order, until an
// operator replays, discards or skips it.
type parkedView struct {
	Stream  string `json:"stream"`
	Bucket  *int   `json:"bucket"`  // in the serving generation; null when the bucket count is unknown
	Waiting int64  `json:"waiting"` // events after what is done
	// ParkedAgo is since when it waits; Action what an operator asked
	// ("" while parked: replay, discard or skip), RequestedAgo when.
	ParkedAgo    float64  `json:"parked_seconds_ago"`
	Action       string   `json:"action"`
	RequestedAgo *float64 `json:"requested_seconds_ago"`
	EventID      string   `json:"event_id"` // the dead letter that parked it
	Position     int64    `json:"position"`
	Reason       string   `json:"reason"`
}

// failoverView is one entry of the schema's failover record that handed
// positions out again.
type failoverView struct {
	At         time.Time `json:"at"`
	Reason     string    `json:"reason"`
	Old        string    `json:"old"` // the server before, system/timeline
	New        string    `json:"new"`
	HeadBefore int64     `json:"head_before"` // the highest position seen on the old server
	HeadAfter  int64     `json:"head_after"`  // the head found on the new one
	FoundBy    string    `json:"found_by"`
}

// failoverShownFor is how long the page shows a failover.
const failoverShownFor = 7 * 24 * time.Hour

// failovers reads the recent failovers that handed positions out again.
func (c *Console) failovers(ctx context.Context, now time.Time) ([]failoverView, error) {
	rec, err := c.opts.Store.ServerChanges(ctx, 10)
	if err != nil {
		return nil, err
	}
	out := []failoverView{}
	for _, r := range rec {
		if r.Reused() && now.Sub(r.At) < failoverShownFor {
			out = append(out, failoverView{At: r.At, Reason: string(r.Reason), Old: r.Old.String(), New: r.New.String(),
				HeadBefore: r.HeadBefore, HeadAfter: r.HeadAfter, FoundBy: r.FoundBy})
		}
	}
	return out, nil
}

// resizeView is a resize in progress, from leasestore.ReadResize: the old
// generation's buckets drain to the cut, the new one's start once the old
// buckets feeding them have drained.
type resizeView struct {
	State          string  `json:"state"` // sealing, cut or switched
	Generation     int     `json:"generation"`
	NextGeneration int     `json:"next_generation"`
	From           int     `json:"from"`         // N
	To             int     `json:"to"`           // M
	Cut            *int64  `json:"cut"`          // C, null until decided
	RequestedBy    string  `json:"requested_by"` // "" when unknown
	RequestedAgo   float64 `json:"requested_seconds_ago"`
	Drained        int     `json:"drained"` // old buckets drained
	Ready          int     `json:"ready"`   // new buckets ready
	// Old and New are the two generations' buckets, by bucket.
	Old []resizeBucketView `json:"old"`
	New []resizeBucketView `json:"new"`
}

// resizeBucketView is one bucket of a generation during a resize.
type resizeBucketView struct {
	Bucket   int    `json:"bucket"` // within its generation
	Slot     int    `json:"slot"`   // its lease and checkpoint key
	Owner    string `json:"owner"`  // "" when free (a drained bucket has none)
	Epoch    int64  `json:"epoch"`
	Proposal *int64 `json:"proposal"` // an old bucket's cut proposal; null when none
	Drained  bool   `json:"drained"`  // an old bucket drained to the cut
	Ready    bool   `json:"ready"`    // a new bucket whose feeders drained: its reader runs
}

// actionsView says which actions the console allows.
type actionsView struct {
	Enabled bool `json:"enabled"` // Options.AllowActions
	Replay  bool `json:"replay"`  // enabled, and Options.Replay is set
}

// workerView is one worker's row: a worker that has joined the subscription's
// pool, live or not.
type workerView struct {
	Worker          string  `json:"worker"`                // the worker id
	Kind            string  `json:"kind"`                  // "row" or "session"
	Live            bool    `json:"live"`                  // unexpired, and its session held (session kind)
	SessionGone     bool    `json:"session_gone"`          // session kind whose advisory lock nobody holds
	HeartbeatAgeSec float64 `json:"heartbeat_age_seconds"` // since its last heartbeat
	ExpiresInSec    float64 `json:"expires_in_seconds"`    // until it stops counting as live (negative: lapsed)
	Owns            int     `json:"owns"`                  // buckets it holds live
}

// bucketView is one bucket: its lease and its checkpoint. Durations are
// judged against State.Now.
type bucketView struct {
	Bucket        int      `json:"bucket"`
	Owner         string   `json:"owner"` // "" when free
	Live          bool     `json:"live"`  // the owner's lease is unexpired
	Epoch         int64    `json:"epoch"`
	ExpiresInSec  *float64 `json:"expires_in_seconds"`               // until the lease expires; null when free
	ClaimWorker   string   `json:"claim_worker,omitempty"`           // a pending handoff claim
	Checkpoint    int64    `json:"checkpoint"`                       // the stored position, 0 when none
	Lag           *int64   `json:"lag"`                              // events after the checkpoint; null when the category is unknown
	OldestLagSec  *float64 `json:"oldest_lag_seconds,omitempty"`     // the age of the oldest of them
	CheckpointAge *float64 `json:"checkpoint_age_seconds,omitempty"` // since the checkpoint was written
}

// inspect reads one subscription as State, with its last ownership
// changes.
func (c *Console) inspect(ctx context.Context, sub string) (subState, error) {
	cat := c.opts.Categories[sub]
	in, err := inspect.InspectReads(ctx, c.opts.Store, c.reads(), sub, cat)
	if err != nil {
		return subState{}, err
	}
	letters, err := c.reads().DeadLetters(ctx, sub, eventsource.DeadLetterFilter{Limit: maxPendingCount + 1})
	if err != nil {
		return subState{}, err
	}
	rs := in.Resize
	in = servingOnly(in)
	st := subState{Subscription: sub, Category: cat, Now: in.Now, Head: in.Head, Buckets: in.Buckets,
		LiveWorkers: in.LiveWorkers(), Workers: []workerView{}, Rows: []bucketView{},
		PendingLetters: min(len(letters), maxPendingCount), PendingMore: len(letters) > maxPendingCount,
		Actions: actionsView{Enabled: c.opts.AllowActions, Replay: c.opts.AllowActions && c.opts.Replay != nil}}
	owned := in.OwnedBy()
	for _, w := range in.Workers {
		st.Workers = append(st.Workers, workerView{Worker: w.Worker, Kind: w.Kind.String(), Live: w.Live && !w.SessionGone,
			SessionGone: w.SessionGone, HeartbeatAgeSec: in.Now.Sub(w.Heartbeat).Seconds(),
			ExpiresInSec: w.Expires.Sub(in.Now).Seconds(), Owns: owned[w.Worker]})
	}
	for _, r := range in.Rows {
		b := bucketView{Bucket: r.Bucket, Owner: r.Owner, Live: r.Live, Epoch: r.Epoch, ClaimWorker: r.ClaimWorker,
			Checkpoint: r.Checkpoint}
		if !r.Expires.IsZero() {
			b.ExpiresInSec = ptr(r.Expires.Sub(in.Now).Seconds())
		}
		if !r.CheckpointAt.IsZero() {
			b.CheckpointAge = ptr(in.Now.Sub(r.CheckpointAt).Seconds())
		}
		if r.Lag >= 0 {
			b.Lag = ptr(r.Lag)
			if r.Lag > 0 && !r.Oldest.IsZero() {
				b.OldestLagSec = ptr(in.Now.Sub(r.Oldest).Seconds())
			}
		}
		st.Rows = append(st.Rows, b)
	}
	st.Parked, st.ParkedMore = []parkedView{}, in.ParkedMore
	for _, p := range in.Parked {
		out := parkedView{Stream: p.Stream, Waiting: p.Waiting, ParkedAgo: in.Now.Sub(p.ParkedAt).Seconds(),
			Action: string(p.Action), EventID: p.EventID.String(), Position: p.Position, Reason: p.Reason}
		if in.Buckets > 0 {
			out.Bucket = ptr(eventsource.BucketOfHash(p.Hash, in.Buckets))
		}
		if p.RequestedAt != nil {
			out.RequestedAgo = ptr(in.Now.Sub(*p.RequestedAt).Seconds())
		}
		st.Parked = append(st.Parked, out)
	}
	st.Generation = rs.Generation
	if rs.Resizing() {
		st.Resize = resizeOf(rs, in.Now)
	}
	if st.Timeline, st.WatchingSince, err = c.timeline(ctx, sub, in.Now); err != nil {
		return subState{}, err
	}
	lag := int64(-1)
	if cat != "" {
		lag = 0
		for _, r := range in.Rows {
			lag += max(r.Lag, 0)
		}
	}
	st.Series = c.series.add(sub, seriesPoint{At: in.Now, Head: in.Head, Lag: lag})
	if st.Failovers, err = c.failovers(ctx, in.Now); err != nil {
		return subState{}, err
	}
	return st, nil
}

// servingOnly keeps the serving generation's rows of in: during a resize
// the lease table holds the next generation's beside them (State.Resize
// shows both), and until the last is pruned some of a retired one's.
func servingOnly(in inspect.Inspection) inspect.Inspection {
	rows := make([]inspect.BucketRow, 0, len(in.Rows))
	for _, r := range in.Rows {
		if r.Generation == in.Resize.Generation {
			rows = append(rows, r)
		}
	}
	in.Rows = rows
	return in
}

// resizeOf renders a resize in progress.
func resizeOf(rs leasestore.Resize, now time.Time) *resizeView {
	out := &resizeView{State: string(rs.State), Generation: rs.Generation, NextGeneration: rs.Generation + 1,
		From: rs.Buckets, To: rs.NextBuckets, RequestedBy: rs.RequestedBy, Old: []resizeBucketView{}, New: []resizeBucketView{}}
	if !rs.RequestedAt.IsZero() {
		out.RequestedAgo = now.Sub(rs.RequestedAt).Seconds()
	}
	if rs.CutDecided {
		out.Cut = ptr(rs.Cut)
	}
	bucket := func(s leasestore.SlotStatus) resizeBucketView {
		b := resizeBucketView{Bucket: s.Bucket, Slot: s.Slot, Owner: s.Owner, Epoch: s.Epoch, Drained: s.Drained, Ready: s.Ready}
		if s.Proposal >= 0 {
			b.Proposal = ptr(s.Proposal)
		}
		return b
	}
	for _, s := range rs.Old {
		out.Old = append(out.Old, bucket(s))
		if s.Drained {
			out.Drained++
		}
	}
	for _, s := range rs.New {
		out.New = append(out.New, bucket(s))
		if s.Ready {
			out.Ready++
		}
	}
	return out
}

func ptr[T any](v T) *T { return &v }

// look is one read of a subscription for its viewers: refused when the
// schema does not know it, else inspected. Viewers share it (Console.looks).
func (c *Console) look(ctx context.Context, sub string) (subState, error) {
	if err := c.checkKnown(ctx, sub); err != nil {
		return subState{}, err
	}
	return c.inspect(ctx, sub)
}

// unknownError is a subscription the schema does not know (HTTP 404).
type unknownError struct{ sub, schema string }

func (e *unknownError) Error() string {
	return fmt.Sprintf("subscription %q is unknown in schema %q: it has no buckets, checkpoints or dead letters "+
		"(the overview lists the subscriptions)", e.sub, e.schema)
}

// checkKnown refuses an invalid subscription name, and one the schema does
// not know (no lease rows, checkpoints or dead letters) unless
// Options.Categories names it: a subscription the console was told about
// has a page before its first worker starts.
func (c *Console) checkKnown(ctx context.Context, sub string) error {
	if err := eventsource.ValidateSubscription(sub); err != nil {
		return err
	}
	if _, ok := c.opts.Categories[sub]; ok {
		return nil
	}
	_, known, err := inspect.Known(ctx, c.opts.Store, sub)
	if err != nil {
		return err
	}
	if !known {
		return &unknownError{sub: sub, schema: c.opts.Store.Schema()}
	}
	return nil
}

// subscriptionJSON serves /api/s/{sub}: the look its viewers share, at
// most lookEvery old.
func (c *Console) subscriptionJSON(w http.ResponseWriter, r *http.Request) {
	st, err := c.looks.get(r.Context(), r.PathValue("sub"))
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	writeJSON(w, st)
}

// reads is the store of the heavy reads: Options.Reads, else Store.
func (c *Console) reads() *eventsource.Store {
	if c.opts.Reads != nil {
		return c.opts.Reads
	}
	return c.opts.Store
}

// subscriptions lists the schema's subscriptions for the overview: the
// leases and resizes read through Store, the checkpoint and dead letter
// counts through reads.
func (c *Console) subscriptions(ctx context.Context) ([]inspect.SubscriptionSummary, error) {
	return inspect.SubscriptionsReads(ctx, c.opts.Store, c.reads())
}

// overviewJSON serves /api/overview: one line per subscription, from the
// read its viewers share.
func (c *Console) overviewJSON(w http.ResponseWriter, r *http.Request) {
	subs, err := c.summary.get(r.Context(), "")
	if err != nil {
		writeError(w, statusOf(err), err.Error())
		return
	}
	if subs == nil {
		subs = []inspect.SubscriptionSummary{}
	}
	writeJSON(w, subs)
}

// statusOf maps a library error to an HTTP status.
func statusOf(err error) int {
	switch {
	case errors.Is(err, eventsource.ErrInvalidName), errors.Is(err, eventsource.ErrInvalidCheckpoint),
		errors.Is(err, errBadRequest):
		return http.StatusBadRequest
	case errors.Is(err, eventsource.ErrDeadLetterNotFound), errors.As(err, new(*unknownError)):
		return http.StatusNotFound
	case errors.Is(err, context.Canceled):
		return 499 // the client went away
	default:
		return http.StatusInternalServerError
	}
}

// changeView is one entry of the subscription's ownership record
// (leasestore.OwnershipChange): the database writes it in the transaction
// that made the change, so the timeline holds every change the record
// keeps, with the time it was made — whether or not a page was open.
type changeView struct {
	At   time.Time `json:"at"`   // the database's clock when the change was made
	Kind string    `json:"kind"` // claim, handoff, steal, release, drain, request, join, leave, resize, …
	// Generation and Bucket are the bucket concerned; both -1 for a
	// worker joining or leaving, or a step of a resize.
	Generation int    `json:"generation"`
	Bucket     int    `json:"bucket"`
	From       string `json:"from,omitempty"`
	To         string `json:"to,omitempty"`
	Epoch      int64  `json:"epoch,omitempty"`
	Evidence   string `json:"evidence,omitempty"`
	// By is who made it: the application_name of its connection (a
	// worker's id, `kumi relinquish`, the console), else its login role.
	By string `json:"by,omitempty"`
}

// maxChanges is how many changes of the record the timeline shows.
const maxChanges = 200

// timeline reads the subscription's last changes from the ownership
// record, newest first, and since when the record keeps them (its
// retention before now).
func (c *Console) timeline(ctx context.Context, sub string, now time.Time) ([]changeView, time.Time, error) {
	pool, schema := c.reads().Pool(), c.opts.Store.Schema()
	rec, err := leasestore.ReadOwnership(ctx, pool, schema,
		leasestore.OwnershipFilter{Subscription: sub, Generation: -1, Limit: maxChanges})
	if err != nil {
		return nil, time.Time{}, err
	}
	keep, err := leasestore.OwnershipRetention(ctx, pool, schema)
	if err != nil {
		return nil, time.Time{}, err
	}
	out := make([]changeView, len(rec))
	for i, r := range rec {
		by := r.Application
		if by == "" {
			by = r.Role
		}
		out[i] = changeView{At: r.At, Kind: r.Kind, Generation: r.Generation, Bucket: r.Bucket, From: r.From, To: r.To,
			Epoch: r.Epoch, Evidence: r.Evidence, By: by}
	}
	return out, now.Add(-keep), nil
}
