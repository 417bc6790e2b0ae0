package eventsource_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
)

// A store in its own schema: create it, migrate it, append, and read the
// stream back.
func Example() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()

	store, err := eventsource.New(pool, eventsource.Config{Schema: schema})
	if err != nil {
		panic(err)
	}
	if err := store.Migrate(ctx); err != nil {
		panic(err)
	}
	_, err = store.Append(ctx, "account-7", eventsource.NoStream, []eventsource.EventData{
		{Type: "Opened", Data: json.RawMessage(`{"owner":"ann"}`)},
		{Type: "Deposited", Data: json.RawMessage(`{"amount":100}`)},
	})
	if err != nil {
		panic(err)
	}
	events, err := store.ReadStream(ctx, "account-7", 0, 100)
	if err != nil {
		panic(err)
	}
	for _, e := range events {
		fmt.Println(e.Version, e.Type, string(e.Data))
	}
	// Output:
	// 0 Opened {"owner": "ann"}
	// 1 Deposited {"amount": 100}
}

// Optimistic concurrency: an append states what it expects the stream's
// version to be, and a conflict says what it is.
func ExampleStore_Append() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)

	deposit := []eventsource.EventData{{Type: "Deposited", Data: json.RawMessage(`{"amount":5}`)}}
	res, err := store.Append(ctx, "account-7", eventsource.NoStream, deposit)
	fmt.Println(res.LastVersion, err)
	res, err = store.Append(ctx, "account-7", eventsource.Exact(0), deposit)
	fmt.Println(res.LastVersion, err)

	_, err = store.Append(ctx, "account-7", eventsource.Exact(0), deposit)
	var conflict *eventsource.WrongExpectedVersionError
	if errors.As(err, &conflict) {
		fmt.Println("conflict: the stream is at version", conflict.Actual)
	}
	// Output:
	// 0 <nil>
	// 1 <nil>
	// conflict: the stream is at version 1
}

// Appending inside your own transaction: the events commit with your other
// writes, or not at all.
func ExampleStore_AppendTx() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)

	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... your own writes on tx ...
		_, err := store.AppendTx(ctx, tx, "order-1", eventsource.NoStream,
			[]eventsource.EventData{{Type: "Placed", Data: json.RawMessage(`{}`)}})
		return err
	})
	store.WakeSequencer() // positions at once for a Sequencer in this process
	events, _ := store.ReadStream(ctx, "order-1", 0, 10)
	fmt.Println(err, len(events))
	// Output: <nil> 1
}

// Reading a long stream in pages, from a version.
func ExampleStore_ReadStream() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)
	for i := range 5 {
		_, _ = store.Append(ctx, "order-1", eventsource.Any,
			[]eventsource.EventData{{Type: "Step", Data: json.RawMessage(fmt.Sprint(i))}})
	}

	for from := int64(0); ; {
		page, err := store.ReadStream(ctx, "order-1", from, 2)
		if err != nil || len(page) == 0 {
			break
		}
		fmt.Print("page:")
		for _, e := range page {
			fmt.Print(" ", e.Version)
		}
		fmt.Println()
		from = page[len(page)-1].Version + 1
	}
	last, _ := store.ReadStreamBackward(ctx, "order-1", -1, 1)
	fmt.Println("last:", last[0].Version)
	// Output:
	// page: 0 1
	// page: 2 3
	// page: 4
	// last: 4
}

// A subscription that follows a category by global position: read from the
// checkpoint, handle, save the checkpoint, and wait for the notifier when
// there is nothing new. The Sequencer gives appended events their
// positions; the Notifier wakes the loop when it does.
func ExampleStore_ReadCategory() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)

	sequencer := eventsource.NewSequencer(store, eventsource.SequencerOptions{})
	_ = sequencer.Start(ctx)
	defer func() { _ = sequencer.Stop(context.Background()) }()
	notifier, _ := store.NewNotifier(eventsource.NotifierOptions{})
	_ = notifier.Start(ctx)
	defer func() { _ = notifier.Stop(context.Background()) }()
	wake, _ := notifier.Listen(store.NotifyChannel())
	defer wake.Close()

	go func() {
		for i := range 3 {
			_, _ = store.Append(ctx, fmt.Sprintf("order-%d", i), eventsource.Any,
				[]eventsource.EventData{{Type: "Placed", Data: json.RawMessage(`{}`)}})
		}
	}()

	handled := 0
	for handled < 3 {
		after, _ := store.Checkpoint(ctx, "mailer", 0)
		events, err := store.ReadCategory(ctx, "order", after, 100)
		if err != nil {
			panic(err)
		}
		for _, e := range events {
			fmt.Println("mail for", e.Stream) // the handler
			handled++
			if _, err := store.SaveCheckpoint(ctx, "mailer", 0, e.Position, nil); err != nil {
				panic(err)
			}
		}
		if len(events) == 0 {
			select {
			case <-wake.C():
			case <-ctx.Done():
				panic(ctx.Err())
			}
		}
	}
	// Unordered output:
	// mail for order-0
	// mail for order-1
	// mail for order-2
}

// Consumer groups: each bucket of a group of n reads the events of its
// share of the streams, and a stream's events always go to the same
// bucket.
func ExampleStore_ReadBucket() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)
	for i := range 20 {
		_, _ = store.Append(ctx, fmt.Sprintf("order-%d", i%5), eventsource.Any,
			[]eventsource.EventData{{Type: "Placed", Data: json.RawMessage(`{}`)}})
	}
	_, _ = store.Sequence(ctx) // a Sequencer does this in the background

	const buckets = 3
	_ = store.EnsureConsumerGroupIndex(ctx, buckets)
	total := 0
	for m := range buckets {
		events, _ := store.ReadBucket(ctx, "order", m, buckets, 0, 1000)
		for _, e := range events {
			if e.Bucket(buckets) != m {
				panic("wrong bucket")
			}
		}
		total += len(events)
	}
	fmt.Println(total, "events")
	stream, _ := eventsource.ParseStreamName("order-3+snapshot")
	fmt.Println(eventsource.BucketOf(stream, buckets) == eventsource.BucketOfHash(eventsource.Hash("3"), buckets))
	// Output:
	// 20 events
	// true
}

// A fenced checkpoint write: it lands only if the fence, checked in the
// same transaction, still holds. A lease store supplies such fences.
func ExampleStore_SaveCheckpoint() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)
	var mails []eventsource.EventData
	for range 10 {
		mails = append(mails, eventsource.EventData{Type: "Queued", Data: []byte(`{}`)})
	}
	_, _ = store.Append(ctx, "mail-1", eventsource.Any, mails)
	_, _ = store.Sequence(ctx) // positions 1 to 10: the head is 10

	holding := true
	fence := eventsource.FenceFunc(func(ctx context.Context, tx pgx.Tx) error {
		if !holding {
			return fmt.Errorf("%w: bucket 0 moved to another worker", eventsource.ErrFenceLost)
		}
		return nil
	})
	p, err := store.SaveCheckpoint(ctx, "mailer", 0, 10, fence)
	fmt.Println(p, err)
	p, err = store.SaveCheckpoint(ctx, "mailer", 0, 5, fence)
	fmt.Println(p, err, "(never backwards)")
	holding = false
	_, err = store.SaveCheckpoint(ctx, "mailer", 0, 20, fence)
	fmt.Println(errors.Is(err, eventsource.ErrFenceLost))
	p, _ = store.Checkpoint(ctx, "mailer", 0)
	fmt.Println(p)
	holding = true
	_, err = store.SaveCheckpoint(ctx, "mailer", 0, 11, fence)
	fmt.Println(errors.Is(err, eventsource.ErrCheckpointAboveHead), "(above the head)")
	// Output:
	// 10 <nil>
	// 10 <nil> (never backwards)
	// true
	// 10
	// true (above the head)
}

// Dead letters: a subscription records an event it gave up on; an operator
// later replays it, which never moves the subscription's checkpoint.
func ExampleStore_ReplayDeadLetters() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)
	res, _ := store.Append(ctx, "order-1", eventsource.Any,
		[]eventsource.EventData{{Type: "Placed", Data: json.RawMessage(`{}`)}})
	_, _ = store.Sequence(ctx)

	_, _ = store.AddDeadLetter(ctx, eventsource.DeadLetter{
		Subscription: "mailer", Bucket: 0, EventID: res.IDs[0], Reason: "smtp: 554 rejected", Attempts: 5,
	})
	letters, _ := store.DeadLetters(ctx, "mailer", eventsource.DeadLetterFilter{})
	fmt.Println(len(letters), letters[0].Stream, letters[0].Reason)

	n, err := store.ReplayDeadLetters(ctx, "mailer", eventsource.DeadLetterFilter{},
		func(ctx context.Context, e eventsource.RecordedEvent) error {
			fmt.Println("replaying", e.Type, "of", e.Stream)
			return nil
		})
	fmt.Println(n, err)
	// Output:
	// 1 order-1 smtp: 554 rejected
	// replaying Placed of order-1
	// 1 <nil>
}

// One notifier per process: listeners get a tick when the sequencer
// announces new positions (or when a notification may have been lost),
// and re-read from their own cursor.
func ExampleNotifier() {
	ctx := context.Background()
	pool, schema, done := exampleDB()
	defer done()
	store, _ := eventsource.New(pool, eventsource.Config{Schema: schema})
	_ = store.Migrate(ctx)

	notifier, _ := store.NewNotifier(eventsource.NotifierOptions{})
	listener, _ := notifier.Listen(store.NotifyChannel())
	defer listener.Close()
	_ = notifier.Start(ctx)
	defer func() { _ = notifier.Stop(ctx) }()

	_, _ = store.Append(ctx, "order-1", eventsource.Any,
		[]eventsource.EventData{{Type: "Placed", Data: json.RawMessage(`{}`)}})
	_, _ = store.Sequence(ctx)
	for listener.Latest() < 1 {
		<-listener.C()
	}
	fmt.Println("head position", listener.Latest())
	// Output: head position 1
}
