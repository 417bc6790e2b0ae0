package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/termsafe"
	"github.com/kumi-run/kumi/leasestore"
)

type resizeCmd struct {
	Subscription    string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Buckets         *int   `placeholder:"M" help:"The new bucket count, 1 to ${max_buckets}. Without it (and without --cancel), follow a running resize or print the last one."`
	Cancel          bool   `help:"Cancel the running resize (possible until its switch, the first new bucket starting)."`
	NoWait          bool   `name:"no-wait" help:"Return once the resize is requested instead of following it to the end."`
	EvictOldWorkers bool   `name:"evict-old-workers" help:"Resize although workers of a kumi version that predates resizes are live: they are fenced out and their buckets move after a TTL."`
	JSON            bool   `name:"json" help:"Print the resize as JSON (at the end) instead of text."`
}

// Run requests, cancels or follows a resize. The CLI drives nothing: the
// workers do the resize (docs/design/resize.md), so a Ctrl-C, or a crash of the
// machine running kumi, leaves it running. It builds the consumer-group
// index for the new count first (eventsource.Store.EnsureConsumerGroupIndex,
// concurrently) and then requests the resize (leasestore.RequestResize).
func (c *resizeCmd) Run(e *env) error {
	switch m := c.Buckets; {
	case c.Cancel && m != nil:
		return usageErrorf("--buckets with --cancel: cancel a resize, or request one")
	case c.Cancel && (c.NoWait || c.EvictOldWorkers):
		return usageErrorf("--cancel takes neither --no-wait nor --evict-old-workers")
	case m != nil && (*m < 1 || *m > leasestore.MaxBuckets):
		return usageErrorf("--buckets %d: a subscription has 1 to %d buckets", *m, leasestore.MaxBuckets)
	case m == nil && (c.NoWait || c.EvictOldWorkers):
		return usageErrorf("--no-wait and --evict-old-workers go with --buckets")
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := eventsource.ValidateSubscription(c.Subscription); err != nil {
		return asUsage(err)
	}
	switch {
	case c.Cancel:
		return c.cancel(e, store)
	case c.Buckets == nil:
		r, err := leasestore.ReadResize(e.ctx, store.Pool(), store.Schema(), c.Subscription)
		if err != nil {
			return c.refused(e, err)
		}
		if !r.Resizing() {
			return c.printSteady(e, r)
		}
		return c.follow(e, store, r)
	}
	return c.request(e, store)
}

// request builds the index, requests the resize and, unless --no-wait,
// follows it.
func (c *resizeCmd) request(e *env, store *eventsource.Store) error {
	before, err := leasestore.ReadResize(e.ctx, store.Pool(), store.Schema(), c.Subscription)
	if err != nil {
		return c.refused(e, err)
	}
	if before.Resizing() || before.Buckets == *c.Buckets {
		// Say so before building an index nobody will read, or printing
		// a plan that moves nothing.
		_, err := leasestore.RequestResize(e.ctx, store.Pool(), store.Schema(), c.req())
		return c.refused(e, err)
	}
	out := c.text(e)
	fmt.Fprintf(out, "%s: %d → %d buckets (generation %d → %d)\n", termsafe.String(c.Subscription),
		before.Buckets, *c.Buckets, before.Generation, before.Generation+1)
	m := *c.Buckets
	index := eventsource.ConsumerGroupIndexName(m)
	if err := store.EnsureConsumerGroupIndex(e.ctx, m); err != nil {
		return fmt.Errorf("the consumer-group index %s for %d buckets: %w (build it as the tables' owner: "+
			"kumi migrate --group-size %d)", index, m, err, m)
	}
	fmt.Fprintf(out, "  index %s: built (concurrently) and valid\n", index)
	if err := c.printWorkers(e, out, store); err != nil {
		return err
	}
	printPlan(out, before.Buckets, m)
	r, err := leasestore.RequestResize(e.ctx, store.Pool(), store.Schema(), c.req())
	if err != nil {
		return c.refused(e, err)
	}
	fmt.Fprintf(out, "requested at %s", clock(r.RequestedAt))
	if c.NoWait {
		fmt.Fprintln(out, "; the workers do it (kumi resize -s SUB follows it, kumi status -s SUB shows it)")
		if c.JSON {
			return e.printJSON(resizeJSON(r))
		}
		return nil
	}
	fmt.Fprintln(out, "; following (Ctrl-C leaves it running)")
	return c.follow(e, store, r)
}

func (c *resizeCmd) req() leasestore.ResizeRequest {
	return leasestore.ResizeRequest{Subscription: c.Subscription, Buckets: *c.Buckets, By: requestedBy(),
		EvictOldWorkers: c.EvictOldWorkers}
}

// text is where the human-readable lines go: stdout, or nowhere with
// --json (which prints the outcome alone).
func (c *resizeCmd) text(e *env) io.Writer {
	if c.JSON {
		return io.Discard
	}
	return e.stdout
}

// requestedBy names the operator in the resize: kumi@HOST.
func requestedBy() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		return "kumi"
	}
	return "kumi@" + host
}

// follow prints the resize's progress until it completes.
func (c *resizeCmd) follow(e *env, store *eventsource.Store, r leasestore.Resize) error {
	out := c.text(e)
	printProgress(out, r)
	last, err := inspect.FollowResize(e.ctx, store.Pool(), store.Schema(), r, 0, func(r leasestore.Resize) {
		printProgress(out, r)
	})
	switch {
	case errors.Is(err, inspect.ErrResizeCancelled):
		fmt.Fprintf(out, "  %s  cancelled: %s keeps %d buckets (generation %d)\n", clock(time.Now()),
			termsafe.String(c.Subscription), last.Buckets, last.Generation)
		if c.JSON {
			_ = e.printJSON(resizeJSON(last))
		}
		return fmt.Errorf("the resize of %q was cancelled", c.Subscription)
	case errors.Is(err, context.Canceled) && e.ctx.Err() != nil:
		return fmt.Errorf("interrupted: the resize goes on without kumi (kumi resize -s %s follows it again)",
			termsafe.String(c.Subscription))
	case err != nil:
		return err
	}
	fmt.Fprintf(out, "  %s  done      generation %d, %d buckets\n", clock(time.Now()), last.Generation, last.Buckets)
	if c.JSON {
		return e.printJSON(resizeJSON(last))
	}
	return nil
}

// cancel cancels the running resize.
func (c *resizeCmd) cancel(e *env, store *eventsource.Store) error {
	r, err := leasestore.CancelResize(e.ctx, store.Pool(), store.Schema(), c.Subscription)
	if err != nil {
		return c.refused(e, err)
	}
	if c.JSON {
		return e.printJSON(resizeJSON(r))
	}
	fmt.Fprintf(e.stdout, "%s: resize cancelled; %d buckets (generation %d), the old buckets go on from where they are\n",
		termsafe.String(c.Subscription), r.Buckets, r.Generation)
	return nil
}

// refused words leasestore's refusals for the command line.
func (c *resizeCmd) refused(e *env, err error) error {
	var inProgress *leasestore.ResizeInProgressError
	var switched *leasestore.ResizeSwitchedError
	sub := termsafe.String(c.Subscription)
	switch {
	case errors.As(err, &inProgress):
		return fmt.Errorf("%s is already resizing %d → %d (state %s, requested %s%s); cancel it or wait",
			sub, inProgress.From, inProgress.To, inProgress.State, clock(inProgress.RequestedAt), by(inProgress.RequestedBy))
	case errors.As(err, &switched):
		return fmt.Errorf("too late to cancel: the resize of %s (%d → %d) switched at %s, a new bucket already delivers; "+
			"let it complete and resize back to %d instead", sub, switched.From, switched.To, clock(switched.SwitchedAt), switched.From)
	case errors.Is(err, leasestore.ErrNoSubscription):
		return fmt.Errorf("subscription %q is unknown in schema %q: no worker has started it "+
			"(`kumi status` lists the subscriptions)", c.Subscription, e.schema)
	case errors.Is(err, leasestore.ErrNoResize):
		return fmt.Errorf("%s has no resize running: nothing to cancel", sub)
	case errors.Is(err, leasestore.ErrSameBuckets):
		return fmt.Errorf("%s already has %d buckets: nothing to do", sub, *c.Buckets)
	}
	return err
}

func by(who string) string {
	if who == "" {
		return ""
	}
	return " by " + termsafe.String(who)
}

// clock prints a database time of day, or "-".
func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("15:04:05.000")
}

// printWorkers says which workers will do the resize, and their protocol.
func (c *resizeCmd) printWorkers(e *env, out io.Writer, store *eventsource.Store) error {
	var snap leasestore.Snapshot
	err := pgx.BeginTxFunc(e.ctx, store.Pool(), pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			snap, err = leasestore.ReadSnapshotTx(e.ctx, tx, store.Schema(), c.Subscription)
			return err
		})
	if err != nil {
		return err
	}
	live, old := 0, []string{}
	for _, m := range snap.Workers {
		if m.Live && !m.SessionGone {
			live++
			if m.Protocol < 2 {
				old = append(old, termsafe.String(m.Worker))
			}
		}
	}
	switch {
	case live == 0:
		fmt.Fprintln(out, "  workers: none live — the resize waits for workers to run it")
	case len(old) == 0:
		fmt.Fprintf(out, "  workers: %d live, all of protocol 2\n", live)
	default:
		fmt.Fprintf(out, "  workers: %d live, of an older kumi (protocol 1): %s\n", live, strings.Join(old, ", "))
	}
	return nil
}

// printPlan says what the workers will do, and what each new bucket waits
// for.
func printPlan(out io.Writer, n, m int) {
	d := gcd(n, m)
	wait := "1 old one"
	if k := n / d; k > 1 {
		wait = fmt.Sprintf("%d old ones", k)
	}
	fmt.Fprintf(out, "  plan: the workers agree on a cut position C; each of the %d old buckets\n", n)
	fmt.Fprintf(out, "        drains to exactly C; new bucket j starts after C once the old buckets\n")
	fmt.Fprintf(out, "        congruent to j modulo %d have drained (gcd(%d, %d) = %d: each new bucket waits for %s)\n",
		d, n, m, d, wait)
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// printProgress prints one line of a followed resize.
func printProgress(out io.Writer, r leasestore.Resize) {
	c := inspect.CountResize(r)
	now := clock(time.Now())
	// Out of N and M, not len(r.Old) and len(r.New): a request's answer
	// carries no buckets yet ("proposals 0/0").
	switch r.State {
	case leasestore.ResizeSealing:
		fmt.Fprintf(out, "  %s  sealing   proposals %d/%d\n", now, c.Proposed, r.Buckets)
	case leasestore.ResizeCut:
		fmt.Fprintf(out, "  %s  cut       C = %d, old drained %d/%d\n", now, r.Cut, c.Drained, r.Buckets)
	case leasestore.ResizeSwitched:
		fmt.Fprintf(out, "  %s  switched  C = %d, old drained %d/%d, new ready %d/%d\n", now, r.Cut, c.Drained, r.Buckets,
			c.Ready, r.NextBuckets)
	}
}

// printSteady prints a subscription that is not resizing, and its last
// resize.
func (c *resizeCmd) printSteady(e *env, r leasestore.Resize) error {
	if c.JSON {
		return e.printJSON(resizeJSON(r))
	}
	fmt.Fprintf(e.stdout, "%s: %d buckets (generation %d), no resize running\n", termsafe.String(c.Subscription),
		r.Buckets, r.Generation)
	if !r.RequestedAt.IsZero() {
		fmt.Fprintf(e.stdout, "  last resize requested %s%s, switched %s\n", r.RequestedAt.Local().Format(time.RFC3339),
			by(r.RequestedBy), clock(r.SwitchedAt))
	}
	return nil
}

// resizeSlotJSON is one bucket of a generation during a resize.
type resizeSlotJSON struct {
	Bucket     int    `json:"bucket"`
	Generation int    `json:"generation"`
	Owner      string `json:"owner"`
	Epoch      int64  `json:"epoch"`
	Proposal   *int64 `json:"proposal,omitempty"`
	Drained    bool   `json:"drained"`
	Ready      bool   `json:"ready"`
}

// resizeOut is a resize in JSON, as `kumi resize --json` and `kumi status
// --json` print it.
type resizeOut struct {
	Subscription   string           `json:"subscription"`
	Generation     int              `json:"generation"`
	Buckets        int              `json:"buckets"`
	State          string           `json:"state"`
	NextGeneration *int             `json:"next_generation,omitempty"`
	NextBuckets    int              `json:"next_buckets,omitempty"`
	Cut            *int64           `json:"cut,omitempty"`
	RequestedAt    *time.Time       `json:"requested_at,omitempty"`
	RequestedBy    string           `json:"requested_by,omitempty"`
	SwitchedAt     *time.Time       `json:"switched_at,omitempty"`
	Old            []resizeSlotJSON `json:"old,omitempty"`
	New            []resizeSlotJSON `json:"new,omitempty"`
}

func resizeJSON(r leasestore.Resize) resizeOut {
	out := resizeOut{Subscription: r.Subscription, Generation: r.Generation, Buckets: r.Buckets, State: string(r.State),
		NextBuckets: r.NextBuckets, RequestedAt: timePtr(r.RequestedAt), RequestedBy: r.RequestedBy,
		SwitchedAt: timePtr(r.SwitchedAt)}
	if r.Resizing() {
		next := r.Generation + 1
		out.NextGeneration = &next
	}
	if r.CutDecided {
		cut := r.Cut
		out.Cut = &cut
	}
	slots := func(gen int, ss []leasestore.SlotStatus) []resizeSlotJSON {
		var o []resizeSlotJSON
		for _, s := range ss {
			j := resizeSlotJSON{Bucket: s.Bucket, Generation: gen, Owner: s.Owner, Epoch: s.Epoch, Drained: s.Drained, Ready: s.Ready}
			if s.Proposal >= 0 && gen == r.Generation {
				p := s.Proposal
				j.Proposal = &p
			}
			o = append(o, j)
		}
		return o
	}
	out.Old, out.New = slots(r.Generation, r.Old), slots(r.Generation+1, r.New)
	return out
}
