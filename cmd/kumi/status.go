package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
)

type statusCmd struct {
	Subscription string        `short:"s" placeholder:"NAME" help:"The subscription to show; without it, a line per subscription of the schema."`
	Category     string        `short:"c" placeholder:"NAME" help:"The subscription's category, to measure each bucket's lag (the lease tables do not record it; one with no events is refused once the subscription has handled some)."`
	JSON         bool          `name:"json" help:"Print JSON instead of tables."`
	History      bool          `name:"history" help:"Print the subscription's ownership record instead, newest first: every claim, handoff, steal, release, worker joining or leaving and resize step, with its time, evidence and who made it."`
	Bucket       *int          `name:"bucket" placeholder:"B" help:"With --history: only bucket B's changes (and the pool's joins, leaves and resizes)."`
	Generation   *int          `name:"generation" placeholder:"G" help:"With --history --bucket: the bucket's generation (default: the serving one)."`
	Since        time.Duration `name:"since" placeholder:"DURATION" help:"With --history: only changes this recent (1h, 30m)."`
	Limit        int           `name:"limit" default:"100" placeholder:"N" help:"With --history: at most N changes (default: ${default})."`
	Failovers    bool          `name:"failovers" help:"Print the schema's failover record instead: every change of server a process found (a promotion, another cluster, a head gone back), with the heads before and after."`
	ReadURL      string        `name:"read-url" env:"KUMI_READ_URL" placeholder:"URL" help:"A hot standby of the database: the heavy reads go there (with -s the lag counts, without it the checkpoint and dead letter counts), and how far it is behind is shown. Never printed."`
}

// Run prints the overview, or one subscription's state.
func (s *statusCmd) Run(e *env) error {
	store, err := e.connect()
	if err != nil {
		return err
	}
	if s.Subscription == "" && s.Category != "" {
		return usageErrorf("--category needs --subscription")
	}
	if s.History {
		return s.printHistory(e, store)
	}
	if s.Failovers {
		return s.printFailovers(e, store)
	}
	if s.Bucket != nil || s.Generation != nil || s.Since != 0 {
		return usageErrorf("--bucket, --generation and --since need --history")
	}
	reads, replica, err := s.reads(e, store)
	if err != nil {
		return err
	}
	if s.Subscription == "" {
		subs, err := inspect.SubscriptionsReads(e.ctx, store, reads)
		if err != nil {
			return err
		}
		if err := s.printOverview(e, subs, replica); err != nil {
			return err
		}
		return s.warnFailovers(e, store)
	}
	in, err := inspect.InspectReads(e.ctx, store, reads, s.Subscription, s.Category)
	if err != nil {
		return asUsage(err)
	}
	if len(in.Rows) == 0 {
		return fmt.Errorf("subscription %q has no buckets in schema %q: no worker has started it "+
			"(`kumi status` without --subscription lists the subscriptions)", s.Subscription, in.Schema)
	}
	if s.JSON {
		out := statusJSON(in)
		out.ReadReplica = replica
		return e.printJSON(out)
	}
	printStatus(e.stdout, in)
	if replica != nil {
		printReplica(e.stdout, in.Now, *replica)
	}
	return s.warnFailovers(e, store)
}

// failoverWarnFor is how long after a failover that handed positions out
// again the status warns of it.
const failoverWarnFor = 7 * 24 * time.Hour

// warnFailovers prints a line for each recent failover that handed
// positions out again: handlers may have seen events that no longer exist.
func (s *statusCmd) warnFailovers(e *env, store *eventsource.Store) error {
	rec, err := store.ServerChanges(e.ctx, 10)
	if err != nil {
		return err
	}
	for _, c := range rec {
		if c.Reused() && time.Since(c.At) < failoverWarnFor {
			fmt.Fprintf(e.stdout, "warning: %s\n", failoverLine(c))
		}
	}
	return nil
}

// failoverLine says what a recorded failover did.
func failoverLine(c eventsource.RecordedServerChange) string {
	line := fmt.Sprintf("%s: the server changed (%s: %s → %s), found by %s",
		c.At.UTC().Format("2006-01-02 15:04:05 UTC"), c.Reason, c.Old, c.New, termsafe.String(c.FoundBy))
	switch {
	case c.Reused():
		line += fmt.Sprintf("; positions %d to %d were handed out again: handlers may have seen events that no longer exist "+
			"(kumi status --failovers; docs/operations.md#failover)", c.HeadAfter+1, c.HeadBefore)
	case c.HeadAfter >= 0:
		line += fmt.Sprintf("; no position was lost (head %d, highest seen %d)", c.HeadAfter, c.HeadBefore)
	}
	return line
}

// printFailovers prints the schema's failover record, newest first.
func (s *statusCmd) printFailovers(e *env, store *eventsource.Store) error {
	if s.Subscription != "" || s.Category != "" {
		return usageErrorf("--failovers is the schema's: it takes no --subscription or --category")
	}
	rec, err := store.ServerChanges(e.ctx, s.Limit)
	if err != nil {
		return err
	}
	if s.JSON {
		if rec == nil {
			rec = []eventsource.RecordedServerChange{}
		}
		return e.printJSON(rec)
	}
	if len(rec) == 0 {
		fmt.Fprintf(e.stdout, "schema %q has recorded no change of server\n", store.Schema())
		return nil
	}
	for _, c := range rec {
		fmt.Fprintln(e.stdout, failoverLine(c))
	}
	return nil
}

// reads is the store the heavy reads go through — --read-url's, or
// store — and, with --read-url, how far that standby is behind.
func (s *statusCmd) reads(e *env, store *eventsource.Store) (*eventsource.Store, *inspect.ReplicaStatus, error) {
	if s.ReadURL == "" {
		return store, nil, nil
	}
	reads, err := e.connectReads(s.ReadURL)
	if err != nil {
		return nil, nil, err
	}
	st, err := inspect.Replica(e.ctx, store, reads)
	if err != nil {
		return nil, nil, fmt.Errorf("--read-url: %w", err)
	}
	return reads, &st, nil
}

func (s *statusCmd) printOverview(e *env, subs []inspect.SubscriptionSummary, replica *inspect.ReplicaStatus) error {
	if s.JSON {
		if subs == nil {
			subs = []inspect.SubscriptionSummary{}
		}
		if replica != nil {
			return e.printJSON(overviewOut{Subscriptions: subs, ReadReplica: replica})
		}
		return e.printJSON(subs)
	}
	if replica != nil {
		defer printReplica(e.stdout, replica.Now, *replica)
	}
	if len(subs) == 0 {
		fmt.Fprintf(e.stdout, "schema %q has no subscriptions yet\n", e.schema)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SUBSCRIPTION\tBUCKETS\tHELD\tLIVE WORKERS\tCHECKPOINTS\tDEAD LETTERS")
	for _, s := range subs {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d", termsafe.String(s.Subscription), s.Buckets, s.Held, s.LiveWorkers, s.Checkpoints, s.DeadLetters)
		if s.Resize != "" {
			fmt.Fprintf(tw, "\tresizing %s", s.Resize)
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// printStatus writes an inspection as two tables: workers, then buckets.
func printStatus(w io.Writer, in inspect.Inspection) {
	held := 0
	for _, r := range in.Rows {
		if r.Live {
			held++
		}
	}
	fmt.Fprintf(w, "subscription %q in schema %q: %s, %d held, %s, head position %d\n",
		in.Subscription, in.Schema, plural(in.Buckets, "bucket"), held, plural(in.LiveWorkers(), "live worker"), in.Head)
	fmt.Fprintf(w, "(times are the database's: %s)\n", in.Now.UTC().Format(time.RFC3339))
	if in.Standby {
		fmt.Fprintln(w, "(read on a hot standby: leases and checkpoints as of its replay; a session worker's lock is held on the primary, so its liveness is unknown here)")
	}
	resizing := in.Resize.Resizing()
	if resizing {
		printResizeHeader(w, in.Resize)
	}
	fmt.Fprintln(w)

	owned := in.OwnedBy()
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "WORKER\tKIND\tLIVE\tHEARTBEAT\tEXPIRES\tOWNS")
	for _, w := range in.Workers {
		live := "yes"
		switch {
		case w.SessionGone:
			live = "no (session gone)"
		case !w.Live:
			live = "no"
		case in.Standby && w.Kind == leasestore.KindSession:
			live = "unknown"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\n", termsafe.String(w.Worker), w.Kind, live, ago(in.Now, w.Heartbeat),
			until(in.Now, w.Expires), owned[w.Worker])
	}
	if len(in.Workers) == 0 {
		fmt.Fprintln(tw, "(none)\t\t\t\t\t")
	}
	_ = tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if resizing {
		fmt.Fprint(tw, "GEN\t")
	}
	fmt.Fprint(tw, "BUCKET\tOWNER\tEPOCH\tLEASE\tCLAIM\tCHECKPOINT\tLAG")
	if resizing {
		fmt.Fprint(tw, "\tRESIZE")
	}
	fmt.Fprintln(tw)
	for _, r := range in.Rows {
		owner, lease := termsafe.String(r.Owner), until(in.Now, r.Expires)
		switch {
		case r.Owner == "":
			owner, lease = "-", "free"
		case !r.Live:
			lease = "expired " + ago(in.Now, r.Expires)
		}
		claim := "-"
		if r.ClaimWorker != "" {
			claim = fmt.Sprintf("%s (%s)", termsafe.String(r.ClaimWorker), ago(in.Now, r.ClaimedAt))
		}
		lag := "-"
		if r.Lag >= 0 {
			lag = fmt.Sprint(r.Lag)
			if r.Lag > 0 && !r.Oldest.IsZero() {
				lag += fmt.Sprintf(" (oldest %s)", ago(in.Now, r.Oldest))
			}
		}
		if resizing {
			fmt.Fprintf(tw, "%d\t", r.Generation)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%d\t%s", r.Bucket, owner, r.Epoch, lease, claim, r.Checkpoint, lag)
		if resizing {
			fmt.Fprintf(tw, "\t%s", slotState(in.Resize, r.BucketState))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	printParked(w, in)
	if in.Category == "" {
		fmt.Fprintln(w, "\n(lag: pass --category to measure it)")
	}
	if in.CategoryEmpty {
		fmt.Fprintf(w, "\nwarning: category %q has no events: a lag of 0 means nothing to read; check it is the subscription's%s\n",
			in.Category, knownCategories(in.Categories))
	}
}

// printParked lists the subscription's parked streams, if any: each
// one's bucket in the serving generation, how many of its events wait,
// since when, what an operator asked for, and the letter's reason.
func printParked(w io.Writer, in inspect.Inspection) {
	if len(in.Parked) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PARKED STREAM\tBUCKET\tWAITING\tSINCE\tSTATE\tREASON")
	for _, p := range in.Parked {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\n", termsafe.String(p.Stream), parkedBucket(in, p), p.Waiting,
			ago(in.Now, p.ParkedAt), parkedState(in.Now, p), termsafe.String(oneLine(p.Reason, 60)))
	}
	_ = tw.Flush()
	if in.ParkedMore {
		fmt.Fprintf(w, "(more than %d parked: kumi parked list -s %s)\n", inspect.MaxParkedShown, in.Subscription)
	}
}

// parkedBucket is p's bucket in the serving generation, "-" when the
// subscription's bucket count is unknown.
func parkedBucket(in inspect.Inspection, p eventsource.ParkedStream) string {
	if in.Buckets == 0 {
		return "-"
	}
	return fmt.Sprint(eventsource.BucketOfHash(p.Hash, in.Buckets))
}

// parkedState says what an operator asked for a parked stream (and, when
// now is not zero, how long ago).
func parkedState(now time.Time, p eventsource.ParkedStream) string {
	switch {
	case p.Action == eventsource.ParkSkip:
		return "skipped"
	case p.Action != "" && now.IsZero():
		return string(p.Action) + " asked"
	case p.Action != "":
		return fmt.Sprintf("%s asked %s", p.Action, ago(now, *p.RequestedAt))
	}
	return "parked"
}

// knownCategories names the categories that have events, for a warning.
func knownCategories(cats []string) string {
	if len(cats) == 0 {
		return " (no category has events yet)"
	}
	safe := make([]string, len(cats))
	for i, c := range cats {
		safe[i] = termsafe.String(c)
	}
	return " (categories with events: " + strings.Join(safe, ", ") + ")"
}

// plural is "1 bucket", "2 buckets".
func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// printReplica writes the read replica's lag after the tables.
func printReplica(w io.Writer, now time.Time, st inspect.ReplicaStatus) {
	paused := ""
	if st.ReplayPaused {
		paused = ", replay paused"
	}
	fmt.Fprintf(w, "\nread replica: head position %d, %d events behind the primary's %d (%d bytes of WAL), last replayed commit %s%s\n",
		st.StandbyHead, st.LagEvents, st.PrimaryHead, st.LagBytes, ago(now, st.ReplayedAt), paused)
}

// printResizeHeader says where a running resize stands.
func printResizeHeader(w io.Writer, r leasestore.Resize) {
	c := inspect.CountResize(r)
	cut := "not decided"
	if r.CutDecided {
		cut = fmt.Sprint(r.Cut)
	}
	fmt.Fprintf(w, "resizing: generation %d → %d, %d → %d buckets, state %s, cut %s\n",
		r.Generation, r.Generation+1, r.Buckets, r.NextBuckets, r.State, cut)
	fmt.Fprintf(w, "  requested %s%s; old proposed %d/%d, drained %d/%d; new ready %d/%d\n",
		r.RequestedAt.UTC().Format(time.RFC3339), by(r.RequestedBy), c.Proposed, len(r.Old), c.Drained, len(r.Old),
		c.Ready, len(r.New))
}

// slotState is a bucket's part in a running resize: an old bucket's
// proposal and drain, a new bucket's feeders and readiness.
func slotState(r leasestore.Resize, b leasestore.BucketState) string {
	if b.Generation == r.Generation {
		switch {
		case b.Drained:
			return "drained"
		case r.CutDecided:
			return "draining to the cut"
		case b.Proposal >= 0:
			return fmt.Sprintf("proposed %d", b.Proposal)
		}
		return "serving (no proposal yet)"
	}
	for _, s := range r.New {
		if s.Slot == b.Slot && s.Ready {
			return "ready"
		}
	}
	d := gcd(r.Buckets, r.NextBuckets)
	return fmt.Sprintf("standby (waits for old buckets ≡ %d mod %d)", b.Bucket%d, d)
}

// ago says how long before now t was, "-" for a zero t.
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return roundDur(now.Sub(t)) + " ago"
}

// until says how long after now t is, or how long ago it passed.
func until(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if d := t.Sub(now); d >= 0 {
		return "in " + roundDur(d)
	}
	return "expired " + ago(now, t)
}

func roundDur(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	default:
		return d.Round(time.Minute).String()
	}
}

type workerJSON struct {
	Worker      string    `json:"worker"`
	Kind        string    `json:"kind"`
	Live        bool      `json:"live"`
	SessionGone bool      `json:"session_gone"`
	JoinedAt    time.Time `json:"joined_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	BackendPID  int       `json:"backend_pid,omitempty"`
	Owns        int       `json:"owns"`
}

type bucketJSON struct {
	Bucket           int        `json:"bucket"`
	Generation       int        `json:"generation"`
	Proposal         *int64     `json:"proposal,omitempty"`
	Drained          bool       `json:"drained,omitempty"`
	Ready            bool       `json:"ready"`
	Owner            string     `json:"owner"`
	Live             bool       `json:"live"`
	Epoch            int64      `json:"epoch"`
	GrantedAt        *time.Time `json:"granted_at"`
	ExpiresAt        *time.Time `json:"expires_at"`
	ExpiresInSeconds *float64   `json:"expires_in_seconds"`
	ClaimWorker      string     `json:"claim_worker,omitempty"`
	ClaimedAt        *time.Time `json:"claimed_at,omitempty"`
	Checkpoint       int64      `json:"checkpoint"`
	CheckpointAt     *time.Time `json:"checkpoint_at"`
	// Lag is null when no category was given.
	Lag           *int64   `json:"lag"`
	OldestSeconds *float64 `json:"oldest_lag_seconds,omitempty"`
}

type statusOut struct {
	Schema       string `json:"schema"`
	Subscription string `json:"subscription"`
	Category     string `json:"category,omitempty"`
	// CategoryEmpty: Category has no events (inspect.Inspection); then
	// Categories are some that have.
	CategoryEmpty bool         `json:"category_empty,omitempty"`
	Categories    []string     `json:"categories_with_events,omitempty"`
	Now           time.Time    `json:"now"`
	Head          int64        `json:"head"`
	BucketCount   int          `json:"bucket_count"`
	LiveWorkers   int          `json:"live_workers"`
	Workers       []workerJSON `json:"workers"`
	Buckets       []bucketJSON `json:"buckets"`
	// Standby: the database read is a hot standby (see inspect.Inspection).
	Standby bool `json:"standby,omitempty"`
	// ReadReplica is --read-url's lag, when given.
	ReadReplica *inspect.ReplicaStatus `json:"read_replica,omitempty"`
	// Generation is the serving generation; Resize the running resize,
	// if any (its state, the next generation and bucket count, the cut).
	Generation int        `json:"generation"`
	Resize     *resizeOut `json:"resize,omitempty"`
	// Parked are the parked streams (at most inspect.MaxParkedShown;
	// ParkedMore: more are parked).
	Parked     []parkedJSON `json:"parked_streams"`
	ParkedMore bool         `json:"parked_streams_more,omitempty"`
}

// parkedJSON is a parked stream in `kumi status --json` and `kumi parked
// list --json`.
type parkedJSON struct {
	Stream string `json:"stream"`
	// Bucket is the stream's bucket in the serving generation (null when
	// the bucket count is unknown).
	Bucket      *int       `json:"bucket"`
	EventID     string     `json:"event_id"`
	Position    int64      `json:"position"`
	Version     int64      `json:"version"`
	DoneVersion int64      `json:"done_version"`
	Waiting     int64      `json:"waiting"`
	ParkedAt    time.Time  `json:"parked_at"`
	Action      string     `json:"action"`
	RequestedAt *time.Time `json:"requested_at"`
	Reason      string     `json:"reason"`
}

func parkedOut(p eventsource.ParkedStream, buckets int) parkedJSON {
	out := parkedJSON{Stream: p.Stream, EventID: p.EventID.String(),
		Position: p.Position, Version: p.Version, DoneVersion: p.DoneVersion, Waiting: p.Waiting, ParkedAt: p.ParkedAt,
		Action: string(p.Action), RequestedAt: p.RequestedAt, Reason: p.Reason}
	if buckets > 0 {
		b := eventsource.BucketOfHash(p.Hash, buckets)
		out.Bucket = &b
	}
	return out
}

// overviewOut is `kumi status --json --read-url URL` without a
// subscription: the overview's lines, and how far the standby is behind.
// (Without --read-url the overview is the array of lines alone.)
type overviewOut struct {
	Subscriptions []inspect.SubscriptionSummary `json:"subscriptions"`
	ReadReplica   *inspect.ReplicaStatus        `json:"read_replica"`
}

func statusJSON(in inspect.Inspection) statusOut {
	owned := in.OwnedBy()
	out := statusOut{Schema: in.Schema, Subscription: in.Subscription, Category: in.Category, Now: in.Now,
		CategoryEmpty: in.CategoryEmpty, Categories: in.Categories,
		Head: in.Head, BucketCount: in.Buckets, LiveWorkers: in.LiveWorkers(),
		Workers: []workerJSON{}, Buckets: []bucketJSON{}, Standby: in.Standby, Generation: in.Resize.Generation,
		Parked: []parkedJSON{}, ParkedMore: in.ParkedMore}
	for _, p := range in.Parked {
		out.Parked = append(out.Parked, parkedOut(p, in.Buckets))
	}
	if in.Resize.Resizing() {
		r := resizeJSON(in.Resize)
		out.Resize = &r
	}
	ready := map[int]bool{}
	for _, s := range in.Resize.New {
		ready[s.Slot] = s.Ready
	}
	for _, w := range in.Workers {
		out.Workers = append(out.Workers, workerJSON{Worker: w.Worker, Kind: w.Kind.String(), Live: w.Live && !w.SessionGone,
			SessionGone: w.SessionGone, JoinedAt: w.Joined, HeartbeatAt: w.Heartbeat, ExpiresAt: w.Expires,
			BackendPID: w.BackendPID, Owns: owned[w.Worker]})
	}
	for _, r := range in.Rows {
		b := bucketJSON{Bucket: r.Bucket, Generation: r.Generation, Drained: r.Drained,
			Ready: r.Generation <= in.Resize.Generation && !r.Drained || ready[r.Slot], Owner: r.Owner, Live: r.Live, Epoch: r.Epoch,
			GrantedAt: timePtr(r.GrantedAt), ExpiresAt: timePtr(r.Expires), ClaimWorker: r.ClaimWorker,
			ClaimedAt: timePtr(r.ClaimedAt), Checkpoint: r.Checkpoint, CheckpointAt: timePtr(r.CheckpointAt)}
		if r.Proposal >= 0 && in.Resize.Resizing() && r.Generation == in.Resize.Generation {
			p := r.Proposal
			b.Proposal = &p
		}
		if !r.Expires.IsZero() {
			s := r.Expires.Sub(in.Now).Seconds()
			b.ExpiresInSeconds = &s
		}
		if r.Lag >= 0 {
			lag := r.Lag
			b.Lag = &lag
			if !r.Oldest.IsZero() && lag > 0 {
				s := in.Now.Sub(r.Oldest).Seconds()
				b.OldestSeconds = &s
			}
		}
		out.Buckets = append(out.Buckets, b)
	}
	return out
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// printHistory prints the subscription's ownership record, newest first.
func (s *statusCmd) printHistory(e *env, store *eventsource.Store) error {
	switch {
	case s.Subscription == "":
		return usageErrorf("--history needs --subscription")
	case s.Limit < 1:
		return usageErrorf("--limit %d: must be at least 1", s.Limit)
	case s.Since < 0:
		return usageErrorf("--since %v: must not be negative", s.Since)
	case s.Generation != nil && s.Bucket == nil:
		return usageErrorf("--generation needs --bucket")
	case s.Generation != nil && *s.Generation < 0:
		return usageErrorf("--generation %d: must not be negative", *s.Generation)
	}
	if err := e.checkSubscription(s.Subscription); err != nil {
		return err
	}
	f := leasestore.OwnershipFilter{Subscription: s.Subscription, Generation: -1, Limit: s.Limit}
	if s.Bucket != nil {
		f.Bucket = *s.Bucket
		if s.Generation != nil {
			f.Generation = *s.Generation
		} else {
			r, err := leasestore.ReadResize(e.ctx, store.Pool(), store.Schema(), s.Subscription)
			if err != nil {
				return err
			}
			f.Generation = r.Generation
		}
	}
	var now time.Time
	if err := store.Pool().QueryRow(e.ctx, "SELECT now()").Scan(&now); err != nil {
		return err
	}
	if s.Since > 0 {
		f.Since = now.Add(-s.Since)
	}
	changes, err := leasestore.ReadOwnership(e.ctx, store.Pool(), store.Schema(), f)
	if err != nil {
		return err
	}
	if s.JSON {
		if changes == nil {
			changes = []leasestore.OwnershipChange{}
		}
		return e.printJSON(changes)
	}
	if len(changes) == 0 {
		fmt.Fprintf(e.stdout, "no ownership changes recorded for %q (the record keeps what its retention says: `kumi migrate --ownership-retention`)\n",
			s.Subscription)
		return nil
	}
	fmt.Fprintf(e.stdout, "ownership record of %q, newest first (times are the database's, UTC)\n", s.Subscription)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tKIND\tBUCKET\tFROM\tTO\tEPOCH\tBY\tEVIDENCE")
	for _, c := range changes {
		bucket, epoch := "-", "-"
		if c.Bucket >= 0 {
			bucket = fmt.Sprintf("%d/%d", c.Generation, c.Bucket)
			epoch = fmt.Sprint(c.Epoch)
		}
		by := c.Application
		if by == "" {
			by = c.Role
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.At.UTC().Format("2006-01-02 15:04:05.000"), c.Kind, bucket,
			orDash(termsafe.String(c.From)), orDash(termsafe.String(c.To)), epoch, orDash(termsafe.String(by)),
			termsafe.String(c.Evidence))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
