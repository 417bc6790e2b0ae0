package main

import (
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/termsafe"
)

type parkedCmd struct {
	List    parkedListCmd    `cmd:"" help:"List a subscription's parked streams: bucket, events waiting, since when, state, the letter's reason."`
	Replay  parkedReplayCmd  `cmd:"" help:"Release a parked stream: its reader delivers the dead-lettered event, then the events that waited, in order."`
	Discard parkedDiscardCmd `cmd:"" help:"Delete a parked stream's dead letter and release it: its reader delivers the events that waited, in order."`
	Skip    parkedSkipCmd    `cmd:"" help:"Pass over a parked stream for good: none of its events is delivered again (asks for --confirm)."`
}

type parkedListCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Bucket       *int   `placeholder:"B" help:"Only the streams of this bucket of the serving generation."`
	After        string `placeholder:"STREAM" help:"Only streams named after this one (to page)."`
	Limit        int    `default:"100" placeholder:"N" help:"At most this many."`
	JSON         bool   `name:"json" help:"Print JSON."`
}

// Run lists parked streams.
func (c *parkedListCmd) Run(e *env) error {
	if c.Limit < 1 {
		return usageErrorf("--limit %d: must be at least 1", c.Limit)
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := e.checkSubscription(c.Subscription); err != nil {
		return err
	}
	n, _, err := inspect.Known(e.ctx, store, c.Subscription)
	if err != nil {
		return err
	}
	filter := eventsource.ParkedFilter{After: c.After, Limit: c.Limit}
	if c.Bucket != nil {
		switch {
		case *c.Bucket < 0:
			return usageErrorf("--bucket %d: buckets are numbered from 0", *c.Bucket)
		case n == 0:
			return fmt.Errorf("subscription %q has no lease rows, so its bucket count is unknown: list without --bucket", c.Subscription)
		case *c.Bucket >= n:
			return usageErrorf("--bucket %d: subscription %q has buckets 0 to %d", *c.Bucket, c.Subscription, n-1)
		}
		filter.Buckets, filter.Bucket = n, *c.Bucket
	}
	parked, err := store.ParkedStreams(e.ctx, c.Subscription, filter)
	if err != nil {
		return asUsage(notMigrated(e, err))
	}
	if c.JSON {
		out := []parkedJSON{}
		for _, p := range parked {
			out = append(out, parkedOut(p, n))
		}
		return e.printJSON(out)
	}
	if len(parked) == 0 {
		fmt.Fprintf(e.stdout, "%q has no parked streams\n", c.Subscription)
		return nil
	}
	in := inspect.Inspection{Subscription: c.Subscription, Buckets: n}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAM\tBUCKET\tWAITING\tPARKED\tSTATE\tEVENT\tPOSITION\tREASON")
	for _, p := range parked {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\n", termsafe.String(p.Stream), parkedBucket(in, p), p.Waiting,
			p.ParkedAt.UTC().Format(time.RFC3339), parkedState(time.Time{}, p), p.EventID, p.Position,
			termsafe.String(oneLine(p.Reason, 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(parked) == c.Limit {
		fmt.Fprintf(e.stdout, "(more may follow: --after %s)\n", termsafe.String(parked[len(parked)-1].Stream))
	}
	return nil
}

type parkedReplayCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Stream       string `arg:"" name:"stream" help:"The parked stream."`
}

// Run asks for a replay.
func (c *parkedReplayCmd) Run(e *env) error {
	return e.parkedAction(admin.Park{Subscription: c.Subscription, Stream: c.Stream, Action: eventsource.ParkReplay})
}

type parkedDiscardCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Stream       string `arg:"" name:"stream" help:"The parked stream."`
}

// Run discards the letter and asks for a release.
func (c *parkedDiscardCmd) Run(e *env) error {
	return e.parkedAction(admin.Park{Subscription: c.Subscription, Stream: c.Stream, Action: eventsource.ParkDiscard})
}

type parkedSkipCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Stream       string `arg:"" name:"stream" help:"The parked stream."`
	Confirm      string `required:"" placeholder:"STREAM" help:"The stream's name again: a skip cannot be undone."`
}

// Run skips a stream for good.
func (c *parkedSkipCmd) Run(e *env) error {
	return e.parkedAction(admin.Park{Subscription: c.Subscription, Stream: c.Stream, Action: eventsource.ParkSkip, Confirm: c.Confirm})
}

// parkedAction carries out p through admin.ParkedStream and says what
// happens next.
func (e *env) parkedAction(p admin.Park) error {
	store, err := e.connect()
	if err != nil {
		return err
	}
	ps, err := admin.ParkedStream(e.ctx, store, p)
	if errors.Is(err, admin.ErrUnconfirmed) {
		return usageErrorf("--confirm %q: repeat the stream's name, %q, to skip it for good", p.Confirm, p.Stream)
	}
	if err != nil {
		return e.adminError(err)
	}
	switch p.Action {
	case eventsource.ParkSkip:
		fmt.Fprintf(e.stdout, "stream %s is skipped for good: its %d waiting events and later ones are not delivered to %q\n",
			termsafe.String(ps.Stream), ps.Waiting, p.Subscription)
	default:
		fmt.Fprintf(e.stdout, "asked to %s stream %s: the reader of its bucket delivers its %d waiting events in order, "+
			"then the stream flows again\n", p.Action, termsafe.String(ps.Stream), ps.Waiting)
	}
	return nil
}
