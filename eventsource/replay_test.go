package eventsource_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// A replay's handler is user code (kumi dead-letters replay --exec runs a
// command): no row lock may be held while it runs, or a live reader
// re-dead-lettering the same event waits for it.
func TestReplayHoldsNoRowLockWhileTheHandlerRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDeadLetters(t, 2)
	b.add(t, "sub", b.events[0], 0, "first failure")

	inHandler := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseHandler := func() { releaseOnce.Do(func() { close(release) }) }
	defer releaseHandler() // on any failure too: the pool's cleanup waits for the replay's connection
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{Limit: 1}, func(context.Context, eventsource.RecordedEvent) error {
			close(inHandler)
			<-release
			return nil
		})
		done <- result{n, err}
	}()
	<-inHandler

	// While the handler runs: the live reader dead-letters the event
	// again, and an operator lists and discards letters. None waits.
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err := b.s.AddDeadLetter(c, eventsource.DeadLetter{Subscription: "sub", EventID: b.events[0].ID, Reason: "second failure", Attempts: 5})
	require.NoError(t, err, "a dead-lettering never waits for a replay's handler")
	// A second replay at once does not hand the letter over again.
	n, err := b.s.ReplayDeadLetters(c, "sub", eventsource.DeadLetterFilter{Limit: 1}, func(context.Context, eventsource.RecordedEvent) error {
		return errors.New("handed over twice")
	})
	require.NoError(t, err)
	require.Zero(t, n, "the letter is claimed by the first replay")

	releaseHandler()
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, 1, r.n)
	// The letter was added again while its replay ran: that newer failure
	// stays pending, with its reason, for the operator to see.
	d, err := b.s.DeadLetter(ctx, "sub", b.events[0].ID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt)
	require.Equal(t, "second failure", d.Reason)

	// Replayed now, it is marked.
	n, err = b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{Limit: 1}, func(context.Context, eventsource.RecordedEvent) error { return nil })
	require.NoError(t, err)
	require.Equal(t, 1, n)
	d, err = b.s.DeadLetter(ctx, "sub", b.events[0].ID)
	require.NoError(t, err)
	require.NotNil(t, d.ReplayedAt)
}

// A replay of an unreadable event's letter fails with the typed error,
// and the letter stays pending with it.
func TestReplayOfAnUnreadableEventFailsTyped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := newStore(t)
	bad := insertPoison(t, s, "sick-1", 0)
	sequenceAll(t, s)
	_, err := s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: bad, Reason: "unreadable"})
	require.NoError(t, err)
	called := false
	n, err := s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(context.Context, eventsource.RecordedEvent) error {
		called = true
		return nil
	})
	var unreadable *eventsource.UnreadableEventError
	require.ErrorAs(t, err, &unreadable)
	require.Equal(t, bad, unreadable.EventID)
	require.Zero(t, n)
	require.False(t, called, "the handler never gets an event without its data")
	d, err := s.DeadLetter(ctx, "sub", bad)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt)
	require.Contains(t, d.Reason, "cannot be read")
}

// A failed replay used to overwrite the letter's reason: the first reason
// the event was given up for was lost. The reasons a letter had are kept,
// oldest first, the first of them always, within a bound.
func TestADeadLetterKeepsTheReasonsItHad(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupDeadLetters(t, 1)
	b.add(t, "sub", b.events[0], 0, "first failure")
	fail := func(msg string) {
		t.Helper()
		_, err := b.s.ReplayDeadLetters(ctx, "sub", eventsource.DeadLetterFilter{}, func(context.Context, eventsource.RecordedEvent) error {
			return errors.New(msg)
		})
		require.ErrorContains(t, err, msg)
	}
	reasons := func() (string, []string, []int) {
		t.Helper()
		d, err := b.s.DeadLetter(ctx, "sub", b.events[0].ID)
		require.NoError(t, err)
		var rs []string
		var as []int
		for _, h := range d.History {
			rs = append(rs, h.Reason)
			as = append(as, h.Attempts)
			require.False(t, h.ReplacedAt.IsZero(), "each entry says when it was replaced")
		}
		return d.Reason, rs, as
	}

	fail("boom")
	reason, history, attempts := reasons()
	require.Equal(t, "replay: boom", reason)
	require.Equal(t, []string{"first failure"}, history)
	require.Equal(t, []int{3}, attempts)

	_, err := b.s.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "sub", EventID: b.events[0].ID, Reason: "again", Attempts: 3})
	require.NoError(t, err)
	reason, history, attempts = reasons()
	require.Equal(t, "again", reason, "dead-lettered again")
	require.Equal(t, []string{"first failure", "replay: boom"}, history)
	require.Equal(t, []int{3, 4}, attempts, "a failed replay adds an attempt")

	for i := range 25 {
		fail(fmt.Sprintf("boom %d", i))
	}
	reason, history, _ = reasons()
	require.Equal(t, "replay: boom 24", reason)
	require.Len(t, history, 20, "bounded")
	require.Equal(t, "first failure", history[0], "the first reason is always kept")
	require.Equal(t, "replay: boom 23", history[19], "then the latest")
	require.Equal(t, "replay: boom 5", history[1])
}
