package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "order", 3, 6)
	for i, e := range evs[:4] {
		_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", Bucket: i % 2,
			EventID: e.ID, Reason: "boom " + itoa(i) + "\nsecond line", Attempts: 5})
		require.NoError(t, err)
	}
	_, err := b.store.SaveCheckpoint(ctx, "shipping", 0, evs[5].Position, nil)
	require.NoError(t, err)

	t.Run("ListShowsPendingLettersByPosition", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "dead-letters", "list", "-s", "shipping")
		require.Equal(t, exitOK, r.code, r.stderr)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		require.Len(t, lines, 5, r.stdout)
		require.Contains(t, lines[1], evs[0].ID.String())
		require.Contains(t, lines[1], "boom 0 second line")
		r = b.run(t, "dead-letters", "list", "-s", "shipping", "--bucket", "1", "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		ls := decode[[]letterJSON](t, r.stdout)
		require.Len(t, ls, 2)
		require.Equal(t, evs[1].ID, ls[0].EventID)
		require.Equal(t, evs[3].ID, ls[1].EventID)
		r = b.run(t, "dead-letters", "list", "-s", "shipping", "--limit", "1")
		require.Contains(t, r.stdout, "(more may follow: --after "+itoa(int(evs[0].Position))+")")
	})
	t.Run("ShowPrintsTheLetterAndItsEvent", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "dead-letters", "show", "-s", "shipping", evs[2].ID.String())
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "stream        "+evs[2].Stream)
		require.Contains(t, r.stdout, "type          Deposited")
		require.Contains(t, r.stdout, `"i": 2`)
		r = b.run(t, "dead-letters", "show", "-s", "shipping", evs[2].ID.String(), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		type shown struct {
			letterJSON
			Event *eventJSON `json:"event"`
		}
		got := decode[shown](t, r.stdout)
		require.Equal(t, 5, got.Attempts)
		require.NotNil(t, got.Event)
		require.JSONEq(t, `{"i":2}`, string(got.Event.Data))
	})
	t.Run("ShowKeepsTheFirstReason", func(t *testing.T) {
		t.Parallel()
		for _, reason := range []string{"the first failure", "the second failure"} {
			_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "history", EventID: evs[5].ID, Reason: reason, Attempts: 5})
			require.NoError(t, err)
		}
		r := b.run(t, "dead-letters", "show", "-s", "history", evs[5].ID.String())
		require.Equal(t, exitOK, r.code, r.stderr)
		require.Contains(t, r.stdout, "reason        the second failure")
		require.Contains(t, r.stdout, "first reason  the first failure (after 5 attempts; replaced ")
		r = b.run(t, "dead-letters", "show", "-s", "history", evs[5].ID.String(), "--json")
		require.Equal(t, exitOK, r.code, r.stderr)
		got := decode[letterJSON](t, r.stdout)
		require.Len(t, got.History, 1)
		require.Equal(t, "the first failure", got.History[0].Reason)
	})
	t.Run("ShowUnknownLetterIsAnError", func(t *testing.T) {
		t.Parallel()
		r := b.run(t, "dead-letters", "show", "-s", "shipping", uuid.NewString())
		require.Equal(t, exitRuntime, r.code)
		require.Contains(t, r.stderr, "kumi dead-letters show: dead letter not found")
		require.NotContains(t, r.stderr, "kumi: ", "kumi said twice")
	})
}

// Replay and discard change the letters, so they have a schema of their own.
func TestDeadLetterReplay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	evs := b.appendEvents(t, "order", 3, 5)
	for _, e := range evs {
		_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", Bucket: 0,
			EventID: e.ID, Reason: "boom", Attempts: 3})
		require.NoError(t, err)
	}
	_, err := b.store.SaveCheckpoint(ctx, "shipping", 0, evs[4].Position, nil)
	require.NoError(t, err)
	dir := t.TempDir()

	// A failing command stops the replay and leaves that letter pending.
	r := b.run(t, "dead-letters", "replay", "-s", "shipping", "--event", evs[1].ID.String(),
		"--exec", `echo "no luck" >&2; exit 3`)
	require.Equal(t, exitRuntime, r.code, r.stdout)
	require.Contains(t, r.stderr, "exit status 3: no luck")
	require.Contains(t, r.stderr, "stays pending")
	d, err := b.store.DeadLetter(ctx, "shipping", evs[1].ID)
	require.NoError(t, err)
	require.Nil(t, d.ReplayedAt)
	require.Equal(t, 4, d.Attempts)

	// One event by id, as show and discard take it: the command gets it
	// as JSON, and its environment. (The first replay above used the
	// former form, --event ID.)
	out := filepath.Join(dir, "one.json")
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", evs[1].ID.String(),
		"--exec", `cat > `+out+`; echo "$KUMI_EVENT_ID $KUMI_STREAM $KUMI_POSITION $KUMI_SUBSCRIPTION" >> `+out)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "replayed 1 dead letter(s)")
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(got)), "\n")
	require.Len(t, lines, 2)
	ev := decode[eventJSON](t, lines[0])
	require.Equal(t, evs[1].ID, ev.EventID)
	require.Equal(t, "shipping", ev.Subscription)
	require.Equal(t, evs[1].ID.String()+" "+evs[1].Stream+" "+itoa(int(evs[1].Position))+" shipping", lines[1])

	// Already replayed: skipped unless --again.
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--event", evs[1].ID.String(), "--exec", "true")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "already replayed")

	// Dry run lists the rest and changes nothing.
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--dry-run")
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "4 dead letter(s) would be replayed")

	// The rest, in position order, through one command each.
	log := filepath.Join(dir, "all.log")
	r = b.run(t, "dead-letters", "replay", "-s", "shipping", "--exec", `echo "$KUMI_POSITION" >> `+log)
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "replayed 4 dead letter(s)")
	got, err = os.ReadFile(log)
	require.NoError(t, err)
	want := []string{}
	for _, i := range []int{0, 2, 3, 4} {
		want = append(want, itoa(int(evs[i].Position)))
	}
	require.Equal(t, want, strings.Fields(string(got)))

	// Replay never moves the checkpoint.
	cp, err := b.store.Checkpoint(ctx, "shipping", 0)
	require.NoError(t, err)
	require.Equal(t, evs[4].Position, cp)
	r = b.run(t, "dead-letters", "list", "-s", "shipping")
	require.Contains(t, r.stdout, "no pending dead letters")
	r = b.run(t, "dead-letters", "list", "-s", "shipping", "--all", "--json")
	require.Len(t, decode[[]letterJSON](t, r.stdout), 5)

	// Discard deletes; a missing one is an error naming it.
	r = b.run(t, "dead-letters", "discard", "-s", "shipping", evs[0].ID.String())
	require.Equal(t, exitOK, r.code, r.stderr)
	r = b.run(t, "dead-letters", "discard", "-s", "shipping", evs[0].ID.String())
	require.Equal(t, exitRuntime, r.code)
	require.Contains(t, r.stderr, "no dead letter for event "+evs[0].ID.String())
}
