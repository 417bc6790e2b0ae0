package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/internal/termsafe"
)

type deadLettersCmd struct {
	List    dlListCmd    `cmd:"" help:"List a subscription's dead letters, by position."`
	Show    dlShowCmd    `cmd:"" help:"Show one dead letter and its event."`
	Replay  dlReplayCmd  `cmd:"" help:"Hand dead-lettered events to a command, one at a time; mark each replayed when the command succeeds. Checkpoints are never moved."`
	Discard dlDiscardCmd `cmd:"" help:"Delete dead letters (their events stay in the store)."`
}

type dlListCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Generation   *int   `placeholder:"G" help:"Only this generation's letters (a resize adds a generation; default: every generation's)."`
	Bucket       *int   `placeholder:"B" help:"Only this bucket's letters: of --generation when given, else of every generation."`
	After        int64  `placeholder:"POSITION" help:"Only letters of events after this position (to page)."`
	Limit        int    `default:"100" placeholder:"N" help:"At most this many."`
	All          bool   `help:"Include letters already replayed."`
	JSON         bool   `name:"json" help:"Print JSON."`
}

type letterJSON struct {
	Subscription string     `json:"subscription"`
	Generation   int        `json:"generation"`
	Bucket       int        `json:"bucket"`
	EventID      uuid.UUID  `json:"event_id"`
	Position     int64      `json:"position"`
	Stream       string     `json:"stream"`
	Reason       string     `json:"reason"`
	Attempts     int        `json:"attempts"`
	CreatedAt    time.Time  `json:"created_at"`
	ReplayedAt   *time.Time `json:"replayed_at"`
	// History is the reasons the letter had before, oldest first.
	History []eventsource.DeadLetterReason `json:"history"`
}

func letterOut(d eventsource.DeadLetter) letterJSON {
	return letterJSON{Subscription: d.Subscription, Generation: d.Generation, Bucket: d.Bucket, EventID: d.EventID, Position: d.Position,
		Stream: d.Stream, Reason: d.Reason, Attempts: d.Attempts, CreatedAt: d.CreatedAt, ReplayedAt: d.ReplayedAt,
		History: append([]eventsource.DeadLetterReason{}, d.History...)}
}

// Run lists letters.
func (c *dlListCmd) Run(e *env) error {
	if c.Limit < 1 {
		return usageErrorf("--limit %d: must be at least 1", c.Limit)
	}
	if c.After < 0 {
		return usageErrorf("--after %d: positions are >= 0", c.After)
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := e.checkLetterSelection(c.Subscription, c.Generation, c.Bucket); err != nil {
		return err
	}
	letters, err := store.DeadLetters(e.ctx, c.Subscription, eventsource.DeadLetterFilter{
		Generation: c.Generation, Bucket: c.Bucket, After: c.After, Limit: c.Limit, IncludeReplayed: c.All})
	if err != nil {
		return asUsage(notMigrated(e, err))
	}
	if c.JSON {
		out := make([]letterJSON, 0, len(letters))
		for _, d := range letters {
			out = append(out, letterOut(d))
		}
		return e.printJSON(out)
	}
	if len(letters) == 0 {
		what := "pending dead letters"
		if c.All {
			what = "dead letters"
		}
		fmt.Fprintf(e.stdout, "%q has no %s\n", c.Subscription, what)
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	// Once the subscription was resized, a bucket number means other
	// streams in another generation: the letters say whose (docs/design/resize.md).
	gens := slices.ContainsFunc(letters, func(d eventsource.DeadLetter) bool { return d.Generation > 0 })
	head, gen := "POSITION\tBUCKET\t", func(eventsource.DeadLetter) string { return "" }
	if gens {
		head, gen = "POSITION\tGEN\tBUCKET\t", func(d eventsource.DeadLetter) string { return fmt.Sprintf("%d\t", d.Generation) }
	}
	fmt.Fprintln(tw, head+"EVENT\tSTREAM\tATTEMPTS\tCREATED\tSTATE\tREASON")
	for _, d := range letters {
		state := "pending"
		if d.ReplayedAt != nil {
			state = "replayed"
		}
		fmt.Fprintf(tw, "%d\t%s%d\t%s\t%s\t%d\t%s\t%s\t%s\n", d.Position, gen(d), d.Bucket, d.EventID, termsafe.String(d.Stream), d.Attempts,
			d.CreatedAt.UTC().Format(time.RFC3339), state, termsafe.String(oneLine(d.Reason, 60)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(letters) == c.Limit {
		fmt.Fprintf(e.stdout, "(more may follow: --after %d)\n", letters[len(letters)-1].Position)
	}
	return nil
}

type dlShowCmd struct {
	Subscription string `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Event        string `arg:"" name:"event-id" help:"The dead-lettered event's id."`
	JSON         bool   `name:"json" help:"Print JSON."`
}

// Run prints one letter and its event.
func (c *dlShowCmd) Run(e *env) error {
	id, err := parseEventID(c.Event)
	if err != nil {
		return err
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := e.checkSubscription(c.Subscription); err != nil {
		return err
	}
	d, err := store.DeadLetter(e.ctx, c.Subscription, id)
	if err != nil {
		return asUsage(notMigrated(e, err))
	}
	ev, evErr := eventAt(e.ctx, store, d)
	if c.JSON {
		out := struct {
			letterJSON
			Event *eventJSON `json:"event"`
		}{letterJSON: letterOut(d)}
		if evErr == nil {
			ej := eventOut(d.Subscription, ev)
			out.Event = &ej
		}
		return e.printJSON(out)
	}
	state := "pending"
	if d.ReplayedAt != nil {
		state = "replayed at " + d.ReplayedAt.UTC().Format(time.RFC3339)
	}
	w := e.stdout
	fmt.Fprintf(w, "subscription  %s\n", termsafe.String(d.Subscription))
	if gen := letterGeneration(e, d); gen != "" {
		fmt.Fprintf(w, "generation    %s\n", gen)
	}
	fmt.Fprintf(w, "bucket        %d\nevent         %s\nposition      %d\nstream        %s\n",
		d.Bucket, d.EventID, d.Position, termsafe.String(d.Stream))
	fmt.Fprintf(w, "attempts      %d\ncreated       %s\nstate         %s\nreason        %s\n",
		d.Attempts, d.CreatedAt.UTC().Format(time.RFC3339), state, termsafe.String(d.Reason))
	for i, h := range d.History { // the reasons it had, oldest (the first) first
		label := "before"
		if i == 0 {
			label = "first reason"
		}
		fmt.Fprintf(w, "%-13s %s (after %d attempts; replaced %s)\n", label, termsafe.String(h.Reason), h.Attempts,
			h.ReplacedAt.UTC().Format(time.RFC3339))
	}
	if evErr != nil {
		fmt.Fprintf(w, "event         (not readable: %s)\n", termsafe.String(evErr.Error()))
		return nil
	}
	fmt.Fprintf(w, "type          %s\nversion       %d\nrecorded      %s\n", termsafe.String(ev.Type), ev.Version,
		ev.RecordedAt.UTC().Format(time.RFC3339Nano))
	fmt.Fprintf(w, "data          %s\n", indentJSON(ev.Data))
	if len(ev.Metadata) > 0 {
		fmt.Fprintf(w, "metadata      %s\n", indentJSON(ev.Metadata))
	}
	return nil
}

// letterGeneration is the generation line of `show`: the letter's
// generation and its role ("0 (retired)"), or "" for a subscription that
// was never resized.
func letterGeneration(e *env, d eventsource.DeadLetter) string {
	in, err := inspect.Inspect(e.ctx, e.store, d.Subscription, "")
	gens := in.Generations()
	switch {
	case err != nil || d.Generation >= len(gens):
		if d.Generation > 0 {
			return fmt.Sprint(d.Generation)
		}
		return ""
	case len(gens) == 1:
		return ""
	}
	return fmt.Sprintf("%d (%s)", d.Generation, gens[d.Generation].Role)
}

// eventAt reads a dead letter's event by its position.
func eventAt(ctx context.Context, store *eventsource.Store, d eventsource.DeadLetter) (eventsource.RecordedEvent, error) {
	evs, err := store.ReadAll(ctx, d.Position-1, 1)
	if err != nil {
		return eventsource.RecordedEvent{}, err
	}
	if len(evs) == 0 || evs[0].ID != d.EventID {
		return eventsource.RecordedEvent{}, fmt.Errorf("no event %s at position %d", d.EventID, d.Position)
	}
	return evs[0], evs[0].Err
}

type eventJSON struct {
	Subscription string          `json:"subscription"`
	EventID      uuid.UUID       `json:"event_id"`
	Stream       string          `json:"stream"`
	Version      int64           `json:"version"`
	Position     int64           `json:"position"`
	Type         string          `json:"type"`
	Data         json.RawMessage `json:"data"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
	RecordedAt   time.Time       `json:"recorded_at"`
}

func eventOut(subscription string, ev eventsource.RecordedEvent) eventJSON {
	return eventJSON{Subscription: subscription, EventID: ev.ID, Stream: ev.Stream, Version: ev.Version,
		Position: ev.Position, Type: ev.Type, Data: ev.Data, Metadata: ev.Metadata, RecordedAt: ev.RecordedAt}
}

type dlReplayCmd struct {
	Subscription string   `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Exec         string   `placeholder:"COMMAND" help:"Shell command run once per event, with the event as JSON on stdin and KUMI_SUBSCRIPTION, KUMI_EVENT_ID, KUMI_STREAM, KUMI_POSITION, KUMI_EVENT_TYPE set. Exit status 0 marks the letter replayed; any other stops the replay and leaves that letter pending."`
	Events       []string `arg:"" optional:"" name:"event-id" help:"Replay only these events' letters (as show and discard take them)."`
	Event        []string `hidden:"" placeholder:"ID" help:"The former form of EVENT-ID: replay only this event's letter (repeatable)."`
	Generation   *int     `placeholder:"G" help:"Only this generation's letters (default: every generation's); a retired generation's replay as any other."`
	Bucket       *int     `placeholder:"B" help:"Only this bucket's letters: of --generation when given, else of every generation."`
	Limit        int      `placeholder:"N" help:"At most this many letters (default: all selected)."`
	Again        bool     `help:"Include letters already replayed."`
	DryRun       bool     `name:"dry-run" help:"List the letters that would be replayed and run nothing."`
}

// Run replays the selected letters through --exec (or lists them).
func (c *dlReplayCmd) Run(e *env) error {
	if c.Exec == "" && !c.DryRun {
		return usageErrorf("say what handles the events: --exec COMMAND (or --dry-run to list them); " +
			"to replay through your own handler, call eventsource.Store.ReplayDeadLetters from your service")
	}
	if c.Limit < 0 {
		return usageErrorf("--limit %d: must not be negative", c.Limit)
	}
	events := append(c.Events, c.Event...)
	if len(events) > 0 && (c.Bucket != nil || c.Generation != nil || c.Limit != 0) {
		return usageErrorf("event ids select letters themselves: drop --generation, --bucket and --limit")
	}
	ids, err := parseEventIDs(events)
	if err != nil {
		return err
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := e.checkLetterSelection(c.Subscription, c.Generation, c.Bucket); err != nil {
		return err
	}
	handler := c.handler(e)
	total := 0
	if len(ids) > 0 {
		for _, id := range ids {
			d, err := admin.Letter(e.ctx, store, c.Subscription, id, c.Again)
			switch {
			case errors.Is(err, admin.ErrAlreadyReplayed):
				fmt.Fprintf(e.stdout, "event %s: already replayed at %s (--again to replay it anyway)\n",
					id, d.ReplayedAt.UTC().Format(time.RFC3339))
				continue
			case err != nil:
				return asUsage(notMigrated(e, err))
			case c.DryRun:
				fmt.Fprintf(e.stdout, "would replay: position %d, event %s, stream %s\n", d.Position, d.EventID, termsafe.String(d.Stream))
				continue
			}
			err = admin.Replay(e.ctx, store, d, c.Again, handler)
			switch {
			case errors.Is(err, admin.ErrNotReplayed):
				fmt.Fprintf(e.stdout, "event %s: not replayed (another replay holds it, or it was replayed meanwhile)\n", id)
			case err != nil:
				return replayFailed(e, total, err)
			default:
				total++
			}
		}
	} else {
		filter := eventsource.DeadLetterFilter{Generation: c.Generation, Bucket: c.Bucket, Limit: c.Limit,
			IncludeReplayed: c.Again}
		if c.DryRun {
			return c.dryRun(e, store, filter)
		}
		n, err := store.ReplayDeadLetters(e.ctx, c.Subscription, filter, handler)
		total += n
		if err != nil {
			return replayFailed(e, total, asUsage(notMigrated(e, err)))
		}
	}
	if !c.DryRun {
		fmt.Fprintf(e.stdout, "replayed %d dead letter(s) of %q; checkpoints unchanged\n", total, c.Subscription)
	}
	return nil
}

func (c *dlReplayCmd) dryRun(e *env, store *eventsource.Store, filter eventsource.DeadLetterFilter) error {
	n := 0
	for {
		page := filter
		page.Limit = 1000
		if filter.Limit > 0 {
			page.Limit = min(page.Limit, filter.Limit-n)
		}
		letters, err := store.DeadLetters(e.ctx, c.Subscription, page)
		if err != nil {
			return asUsage(notMigrated(e, err))
		}
		for _, d := range letters {
			fmt.Fprintf(e.stdout, "would replay: position %d, event %s, stream %s\n", d.Position, d.EventID, termsafe.String(d.Stream))
		}
		n += len(letters)
		if len(letters) < page.Limit || (filter.Limit > 0 && n >= filter.Limit) {
			fmt.Fprintf(e.stdout, "%d dead letter(s) would be replayed\n", n)
			return nil
		}
		filter.After = letters[len(letters)-1].Position
	}
}

func replayFailed(e *env, done int, err error) error {
	fmt.Fprintf(e.stdout, "replayed %d dead letter(s) before the failure; checkpoints unchanged\n", done)
	return fmt.Errorf("%w (that letter stays pending, its attempts counted)", err)
}

// handler runs c.Exec for one event.
func (c *dlReplayCmd) handler(e *env) eventsource.ReplayHandler {
	return func(ctx context.Context, ev eventsource.RecordedEvent) error {
		in, err := json.Marshal(eventOut(c.Subscription, ev))
		if err != nil {
			return err
		}
		cmd := exec.CommandContext(ctx, "/bin/sh", "-c", c.Exec)
		cmd.Stdin = bytes.NewReader(append(in, '\n'))
		var tail tailWriter
		cmd.Stdout = e.rawStdout
		cmd.Stderr = io.MultiWriter(e.rawStderr, &tail)
		cmd.Env = append(os.Environ(),
			"KUMI_SUBSCRIPTION="+c.Subscription,
			"KUMI_EVENT_ID="+ev.ID.String(),
			"KUMI_STREAM="+ev.Stream,
			fmt.Sprintf("KUMI_POSITION=%d", ev.Position),
			"KUMI_EVENT_TYPE="+ev.Type,
		)
		if err := cmd.Run(); err != nil {
			if last := tail.last(); last != "" {
				return fmt.Errorf("--exec for event %s (position %d): %w: %s", ev.ID, ev.Position, err, last)
			}
			return fmt.Errorf("--exec for event %s (position %d): %w", ev.ID, ev.Position, err)
		}
		return nil
	}
}

type dlDiscardCmd struct {
	Subscription string   `short:"s" required:"" placeholder:"NAME" help:"The subscription."`
	Events       []string `arg:"" name:"event-id" help:"The ids of the events whose letters to delete."`
}

// Run deletes letters.
func (c *dlDiscardCmd) Run(e *env) error {
	ids, err := parseEventIDs(c.Events)
	if err != nil {
		return err
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := e.checkSubscription(c.Subscription); err != nil {
		return err
	}
	var missing []string
	for _, id := range ids {
		switch err := admin.Discard(e.ctx, store, c.Subscription, id); {
		case errors.Is(err, admin.ErrNoLetter):
			missing = append(missing, id.String())
		case err != nil:
			return asUsage(notMigrated(e, err))
		default:
			fmt.Fprintf(e.stdout, "discarded the dead letter of event %s\n", id)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%q has no dead letter for event %s", c.Subscription, strings.Join(missing, ", "))
	}
	return nil
}

func parseEventID(s string) (uuid.UUID, error) {
	id, err := uuid.Parse(s)
	if err != nil {
		return uuid.Nil, usageErrorf("event id %q is not a UUID", s)
	}
	return id, nil
}

// parseEventIDs parses event ids given on the command line.
func parseEventIDs(args []string) ([]uuid.UUID, error) {
	ids := make([]uuid.UUID, 0, len(args))
	for _, s := range args {
		id, err := parseEventID(s)
		if err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// checkLetterSelection refuses what checkSubscription refuses, a
// --generation the subscription does not have, and a --bucket beyond that
// generation's bucket count — without --generation, beyond every
// generation's: the bucket then selects its letters in every generation.
func (e *env) checkLetterSelection(name string, generation, bucket *int) error {
	if generation != nil && *generation < 0 {
		return usageErrorf("--generation %d: generations are numbered from 0", *generation)
	}
	if err := e.checkSubscription(name); err != nil || (generation == nil && bucket == nil) {
		return err
	}
	in, err := inspect.Inspect(e.ctx, e.store, name, "")
	if err != nil {
		return asUsage(err)
	}
	gens := in.Generations()
	n := in.MaxBuckets()
	if generation != nil {
		g, err := in.Generation(*generation)
		if err != nil {
			return usageErrorf("--generation %d: %v", *generation, err)
		}
		n = g.Buckets
	}
	switch {
	case bucket == nil || n == 0 || *bucket < n:
		return nil
	case len(gens) == 1:
		return usageErrorf("--bucket %d: subscription %q has buckets 0 to %d", *bucket, name, n-1)
	case generation != nil:
		return usageErrorf("--bucket %d: generation %d of subscription %q has buckets 0 to %d", *bucket, *generation, name, n-1)
	}
	return usageErrorf("--bucket %d: no generation of subscription %q has more than %d buckets (0 to %d)", *bucket, name, n, n-1)
}

// oneLine flattens s to one line of at most n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}

func indentJSON(raw json.RawMessage) string {
	var b bytes.Buffer
	if err := json.Indent(&b, raw, "              ", "  "); err != nil {
		return termsafe.String(string(raw))
	}
	return string(termsafe.JSON(b.Bytes()))
}

// tailWriter keeps the last line written to it.
type tailWriter struct{ buf []byte }

// Write keeps the last 4 KiB written.
func (t *tailWriter) Write(p []byte) (int, error) {
	t.buf = append(t.buf, p...)
	if len(t.buf) > 4096 {
		t.buf = t.buf[len(t.buf)-4096:]
	}
	return len(p), nil
}

func (t *tailWriter) last() string {
	lines := strings.Split(strings.TrimSpace(string(t.buf)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// notMigrated adds the migrate hint to "relation/schema does not exist".
func notMigrated(e *env, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "3F000") {
		return fmt.Errorf("%w (schema %q has no kumi tables: run `kumi migrate`, or pass the right --schema)", err, e.schema)
	}
	return err
}
