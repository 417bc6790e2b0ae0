package actors

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
)

// insertPoison writes, through SQL as an older version or a DBA could, an
// event of stream whose text form exceeds PostgreSQL's 1 GB limit: every
// read that returns its payload fails with "out of memory" (54000).
func insertPoison(t *testing.T, store *eventsource.Store, stream string) uuid.UUID {
	t.Helper()
	ctx := context.Background()
	sn, err := eventsource.ParseStreamName(stream)
	require.NoError(t, err)
	id := uuid.New()
	_, err = store.Pool().Exec(ctx, fmt.Sprintf(`WITH s AS (
  INSERT INTO %[1]s.streams AS st (stream_name, version) VALUES ($2, 0)
  ON CONFLICT (stream_name) DO UPDATE SET version = st.version + 1 RETURNING version), r AS (
  INSERT INTO %[1]s.appends (stream_name, first_version, last_version, category, cg_hash)
  SELECT $2, s.version, s.version, $3, %[1]s.cg_hash($4) FROM s RETURNING seq)
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT r.seq, $1, $2, $3, $4, %[1]s.cg_hash($4), s.version, 'Poison',
  (SELECT jsonb_agg('1e131071'::numeric) FROM generate_series(1, 8300)) FROM s, r`, store.QuotedSchema()),
		id, stream, sn.Category, sn.CardinalID)
	require.NoError(t, err)
	return id
}

// waitPoison bounds the waits of a test with a real unreadable event: each
// read that meets it makes PostgreSQL build a 1 GB string before it fails
// (seconds of a core each, longer on a busy machine), and both publishers
// and the bucket's reader meet it.
const waitPoison = 4 * time.Minute

func TestAnUnreadableEventCostsItsBucketADeadLetter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, schema := newTestStore(t)
	acct, other := newRecorder(), newRecorder()
	startWorker(t, schema, "a", groupOpts("poison", 4, acct, "a"))
	oo := groupOpts("bystander", 2, other, "b")
	oo.Category = "other"
	startWorker(t, schema, "b", oo)

	seed(t, store, "acct", 8, 40)
	seed(t, store, "other", 4, 20)
	bad := insertPoison(t, store, "acct-1")
	// After the poison: its own stream, its bucket, other buckets and
	// another category.
	seed(t, store, "acct", 8, 40)
	seed(t, store, "other", 4, 20)

	pgtest.Eventually(t, waitPoison, func() bool { return acct.distinct() == 80 }, "every readable acct event handled (got %d)", observed(acct.distinct))
	pgtest.Eventually(t, waitPoison, func() bool { return other.distinct() == 40 }, "every other event handled (got %d)", observed(other.distinct))
	var letters []eventsource.DeadLetter
	pgtest.Eventually(t, waitPoison, func() bool {
		var err error
		letters, err = store.DeadLetters(ctx, "poison", eventsource.DeadLetterFilter{})
		return err == nil && len(letters) == 1
	}, "the unreadable event is dead-lettered")
	require.Equal(t, bad, letters[0].EventID)
	require.Equal(t, "acct-1", letters[0].Stream)
	require.Equal(t, eventsource.BucketOf(eventsource.StreamName{CardinalID: "1"}, 4), letters[0].Bucket)
	require.Contains(t, letters[0].Reason, "cannot be read")
	require.Zero(t, acct.duplicates())
	require.Empty(t, acct.order)
	for id := range acct.count {
		require.NotEqual(t, bad, id, "the handler never gets the unreadable event")
	}
	none, err := store.DeadLetters(ctx, "bystander", eventsource.DeadLetterFilter{})
	require.NoError(t, err)
	require.Empty(t, none)
}
