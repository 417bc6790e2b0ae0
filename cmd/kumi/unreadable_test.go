package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
)

// A dead letter of an event the store cannot give back (written through
// SQL, its text form over PostgreSQL's 1 GB limit) shows as not readable,
// with the reason, and its replay fails and leaves it pending.
func TestDeadLetterOfAnUnreadableEvent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := uuid.New()
	_, err := b.store.Pool().Exec(ctx, fmt.Sprintf(`WITH s AS (
  INSERT INTO %[1]s.streams (stream_name, version) VALUES ('order-9', 0) RETURNING version), r AS (
  INSERT INTO %[1]s.appends (stream_name, first_version, last_version, category, cg_hash)
  SELECT 'order-9', s.version, s.version, 'order', %[1]s.cg_hash('9') FROM s RETURNING seq)
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT r.seq, $1, 'order-9', 'order', '9', %[1]s.cg_hash('9'), s.version, 'Poison',
  (SELECT jsonb_agg('1e131071'::numeric) FROM generate_series(1, 8300)) FROM s, r`, b.store.QuotedSchema()), id)
	require.NoError(t, err)
	_, err = b.store.Sequence(ctx)
	require.NoError(t, err)
	_, err = b.store.AddDeadLetter(ctx, eventsource.DeadLetter{Subscription: "shipping", EventID: id, Reason: "unreadable"})
	require.NoError(t, err)

	r := b.run(t, "dead-letters", "show", "-s", "shipping", id.String())
	require.Equal(t, exitOK, r.code, r.stderr)
	require.Contains(t, r.stdout, "stream        order-9")
	require.Contains(t, r.stdout, "(not readable: ")
	require.Contains(t, r.stdout, "cannot be read")
	require.NotContains(t, r.stdout, "data          ")
}
