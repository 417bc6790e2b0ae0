package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/leasestore"
)

// TestPoisonEvent: an event no read can return — written through SQL, as
// an older version or a DBA could, with numbers jsonb prints as 131,072
// digits each, more than PostgreSQL's 1 GB limit on a value's text, so
// that every read returning it fails with "out of memory" — lands in the
// middle of a steady load, while workers run on its category and others,
// in processes of their own, on another category. Each worker's publisher
// reads the whole store ($all) and so meets it. The bad event costs its
// bucket a dead letter, nothing else: nothing else of its category, its
// bucket and its stream included, and nothing of the other category is
// lost, and nothing is out of order.
func TestPoisonEvent(t *testing.T) {
	e := newEnv(t, pgtest.URL(t), clusterConfig{Buckets: 4, Kind: leasestore.KindRow})
	bcfg := e.cfg
	bcfg.Subscription, bcfg.Category = "bystander", "other"
	bystanders := newCluster(t, bcfg)
	bo := newObserver(t, e.url, bcfg.Schema, bcfg.Subscription, bcfg.Category, bcfg.Buckets, 20*time.Millisecond)
	e.startWorkers(1, startOpts{})
	bystanders.start("b1", startOpts{})
	if _, ok := bo.waitFairSplit(bystanders.live, 90*time.Second); !ok {
		t.Fatalf("the bystanders own no fair split: %s", bo.ownedSummary())
	}
	e.startLoad(pick(100, 300), 50)
	other := appendSteadily(t, e, bcfg.Category, pick(20, 50))
	time.Sleep(pick(2*time.Second, 10*time.Second))

	stream := categoryName + "-poison"
	bad := insertUnreadable(t, e, stream)
	e.o.excuse(bad)
	// After it: its own stream, and more of everything.
	appendTo(t, e, stream, 5)
	time.Sleep(pick(5*time.Second, 30*time.Second))
	other.stop()

	var letters []eventsource.DeadLetter
	r := e.finish("poison-event", func(r *report) {
		letters = deadLettersOf(t, e, subscriptionName)
		r.extra = append(r.extra, fmt.Sprintf("dead_letters=%d other_appended=%d", len(letters), other.n))
	})
	requireSafe(t, r)
	if len(letters) != 1 || letters[0].EventID != bad {
		t.Errorf("want the unreadable event %s dead-lettered, and only it: %+v", bad, letters)
	} else if !strings.Contains(letters[0].Reason, "cannot be read") {
		t.Errorf("the dead letter's reason does not say why: %q", letters[0].Reason)
	}

	if !bo.settle(pick(60*time.Second, 180*time.Second)) {
		t.Errorf("the other category's events never all reached the sink; bystanders own: %s", bo.ownedSummary())
	}
	br := bo.collect("poison-event-bystanders", bcfg.Kind.String(), nil)
	fmt.Println(br.line())
	requireSafe(t, br)
	if n := len(deadLettersOf(t, e, bcfg.Subscription)); n != 0 {
		t.Errorf("the other category has %d dead letters", n)
	}
	bystanders.stopAll()
	bystanders.checkProcesses()
}

// insertUnreadable writes an event of stream through SQL whose text form
// exceeds PostgreSQL's 1 GB limit (Append refuses it: its text form is
// bounded by MaxEventSize), and sequences it.
func insertUnreadable(t *testing.T, e *env, stream string) uuid.UUID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, store := openStore(t, e)
	defer pool.Close()
	sn, err := eventsource.ParseStreamName(stream)
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.New()
	if _, err := pool.Exec(ctx, fmt.Sprintf(`WITH s AS (
  INSERT INTO %[1]s.streams AS st (stream_name, version) VALUES ($2, 0)
  ON CONFLICT (stream_name) DO UPDATE SET version = st.version + 1 RETURNING version), r AS (
  INSERT INTO %[1]s.appends (stream_name, first_version, last_version, category, cg_hash)
  SELECT $2, s.version, s.version, $3, %[1]s.cg_hash($4) FROM s RETURNING seq)
INSERT INTO %[1]s.events (seq, event_id, stream_name, category, cardinal_id, cg_hash, version, type, data)
SELECT r.seq, $1, $2, $3, $4, %[1]s.cg_hash($4), s.version, 'Poison',
  (SELECT jsonb_agg('1e131071'::numeric) FROM generate_series(1, 8300)) FROM s, r`, store.QuotedSchema()),
		id, stream, sn.Category, sn.CardinalID); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Sequence(ctx); err != nil {
		t.Fatal(err)
	}
	return id
}

func openStore(t *testing.T, e *env) (*pgxpool.Pool, *eventsource.Store) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), e.url)
	if err != nil {
		t.Fatal(err)
	}
	store, err := eventsource.New(pool, eventsource.Config{Schema: e.cfg.Schema})
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	return pool, store
}

// appendTo appends n events to stream, one at a time.
func appendTo(t *testing.T, e *env, stream string, n int) {
	t.Helper()
	pool, store := openStore(t, e)
	defer pool.Close()
	for i := range n {
		data, _ := json.Marshal(map[string]int{"n": i})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := store.Append(ctx, stream, eventsource.Any, []eventsource.EventData{{Type: "After", Data: data}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
	}
}

// steady appends to a category about rate events a second until stopped.
type steady struct {
	stopc chan struct{}
	done  chan struct{}
	n     int
}

func appendSteadily(t *testing.T, e *env, category string, rate int) *steady {
	t.Helper()
	pool, store := openStore(t, e)
	s := &steady{stopc: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		defer pool.Close()
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for {
			select {
			case <-s.stopc:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := store.Append(ctx, fmt.Sprintf("%s-%d", category, s.n%20), eventsource.Any,
				[]eventsource.EventData{{Type: "Steady", Data: []byte(fmt.Sprintf(`{"n":%d}`, s.n))}})
			cancel()
			if err == nil {
				s.n++
			}
		}
	}()
	t.Cleanup(s.stop)
	return s
}

func (s *steady) stop() {
	select {
	case <-s.stopc:
	default:
		close(s.stopc)
	}
	<-s.done
}

// deadLettersOf lists a subscription's dead letters.
func deadLettersOf(t *testing.T, e *env, subscription string) []eventsource.DeadLetter {
	t.Helper()
	pool, store := openStore(t, e)
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	letters, err := store.DeadLetters(ctx, subscription, eventsource.DeadLetterFilter{IncludeReplayed: true})
	if err != nil {
		t.Fatal(err)
	}
	return letters
}
