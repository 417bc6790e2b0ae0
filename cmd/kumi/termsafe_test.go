package main

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/termsafe"
)

// hostile is what a terminal would act on: ESC (clear screen), BEL, CR,
// a C1 CSI, DEL and a bidi override.
const hostile = "w\x1b[2J\a\r\u009b31m\x7f\u202eevil\tx\ny"

// Values that reach the tables however they got there — a worker id, a
// stream name, a handler's error as a reason — are shown as visible
// escapes by every command, in text and in JSON (issue 18 §5).
func TestHostileValuesAreEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	q := b.store.QuotedSchema()
	exec := func(sql string, args ...any) {
		_, err := b.store.Pool().Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	exec(`INSERT INTO `+q+`.lease_workers (subscription, worker, kind, heartbeat_at, expires_at)
VALUES ('balances', $1, 'row', now(), now() + interval '1 hour'), ('balances', 'plain', 'row', now(), now() + interval '1 hour')`, hostile)
	exec(`INSERT INTO `+q+`.lease_buckets (subscription, bucket, bucket_count, owner, epoch, granted_at, expires_at, heartbeat_at, claim_worker, claimed_at)
VALUES ('balances', 0, 2, $1, 1, now(), now() + interval '1 hour', now(), NULL, NULL),
       ('balances', 1, 2, $1, 1, now(), now() + interval '1 hour', now(), $1, now())`, hostile)
	evs := b.appendEvents(t, "order", 1, 1)
	_, err := b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", Bucket: 0,
		EventID: evs[0].ID, Reason: "boom: " + hostile, Attempts: 1})
	require.NoError(t, err)
	exec(`UPDATE `+q+`.dead_letters SET reason = $1, stream_name = $1`, hostile)
	_, err = b.store.SaveCheckpoint(ctx, "shipping", 0, 0, nil)
	require.NoError(t, err)

	id := evs[0].ID.String()
	for _, args := range [][]string{
		{"status"},
		{"status", "-s", "balances", "-c", "order"},
		{"checkpoints", "show", "-s", "balances"},
		{"checkpoints", "reset", "-s", "balances", "--bucket", "0", "--position", "0"},
		{"relinquish", "-s", "balances", "--bucket", "0", "--to", hostile},
		{"relinquish", "-s", "balances", "--bucket", "1"},
		{"dead-letters", "list", "-s", "shipping"},
		{"dead-letters", "show", "-s", "shipping", id},
		{"dead-letters", "replay", "-s", "shipping", "--dry-run"},
		{"dead-letters", "replay", "-s", "shipping", "--event", id, "--dry-run"},
	} {
		r := b.run(t, args...)
		out := r.stdout + r.stderr
		for _, c := range out {
			require.False(t, termsafe.Unsafe(c) && c != '\n' && c != '\t', "kumi %q prints %q raw:\n%s", args, c, out)
		}
		if len(args) > 1 { // the overview shows no worker
			require.Contains(t, out, `w\x1b[2J`, "kumi %q", args)
		}
	}
	// Tab and newline are escaped too where a value is laid out.
	for _, args := range [][]string{{"status", "-s", "balances"}, {"dead-letters", "show", "-s", "shipping", id}} {
		require.Contains(t, b.run(t, args...).stdout, `\u202eevil\tx\ny`, "kumi %q", args)
	}
	// JSON: the same values, escaped so that the JSON means the same.
	for _, c := range []struct {
		args []string
		get  func(string) string
	}{
		{[]string{"status", "-s", "balances", "--json"}, func(s string) string { return decode[statusOut](t, s).Buckets[0].Owner }},
		{[]string{"checkpoints", "show", "-s", "balances", "--json"}, func(s string) string { return decode[[]checkpointJSON](t, s)[0].Owner }},
		{[]string{"dead-letters", "list", "-s", "shipping", "--json"}, func(s string) string { return decode[[]letterJSON](t, s)[0].Reason }},
		{[]string{"dead-letters", "show", "-s", "shipping", id, "--json"}, func(s string) string { return decode[letterJSON](t, s).Stream }},
	} {
		r := b.run(t, c.args...)
		require.Equal(t, exitOK, r.code, r.stderr)
		for _, ch := range r.stdout {
			require.False(t, termsafe.Unsafe(ch) && ch != '\n', "kumi %q prints %q raw:\n%s", c.args, ch, r.stdout)
		}
		require.Equal(t, hostile, c.get(r.stdout), "kumi %q", c.args)
	}
}
