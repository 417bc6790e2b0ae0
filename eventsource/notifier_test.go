package eventsource_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

// Notifier tests disable the safety poll (PollInterval -1) unless they test
// it, so that a tick proves a notification arrived.
var fastReconnect = eventsource.NotifierOptions{
	PollInterval: -1,
	ReconnectMin: 10 * time.Millisecond,
	ReconnectMax: 200 * time.Millisecond,
}

func startNotifier(t *testing.T, n *eventsource.Notifier) {
	t.Helper()
	require.NoError(t, n.Start(context.Background()))
	t.Cleanup(func() { require.NoError(t, n.Stop(context.Background())) })
	pgtest.Eventually(t, 10*time.Second, func() bool { return n.Stats().Connected }, "notifier connected")
}

// waitTick reports whether l ticks within timeout.
func waitTick(l *eventsource.Listener, timeout time.Duration) bool {
	select {
	case <-l.C():
		return true
	case <-time.After(timeout):
		return false
	}
}

// drainTick empties l's channel.
func drainTick(l *eventsource.Listener) {
	select {
	case <-l.C():
	default:
	}
}

func randomChannel() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "kumi_test_" + hex.EncodeToString(b[:])
}

func notify(t *testing.T, pool *pgxpool.Pool, channel, payload string) {
	t.Helper()
	_, err := pool.Exec(context.Background(), "SELECT pg_notify($1, $2)", channel, payload)
	require.NoError(t, err)
}

func TestNotifier(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ANotificationWakesAWaiter", func(t *testing.T) {
		t.Parallel()
		ch := randomChannel()
		n, err := eventsource.NewNotifier(pgtest.Pool(t), eventsource.NotifierOptions{Channels: []string{ch}, PollInterval: -1})
		require.NoError(t, err)
		l, err := n.Listen(ch)
		require.NoError(t, err)
		defer l.Close()
		startNotifier(t, n)
		require.True(t, waitTick(l, 5*time.Second), "connecting wakes listeners to look once")

		woke := make(chan int64)
		go func() {
			<-l.C()
			woke <- l.Latest()
		}()
		notify(t, pgtest.Pool(t), ch, "42")
		select {
		case latest := <-woke:
			require.Equal(t, int64(42), latest)
		case <-time.After(5 * time.Second):
			t.Fatal("the notification did not wake the waiter")
		}
		require.Equal(t, int64(1), n.Stats().Notifications)
	})

	t.Run("TheSequencerWakesTheStoresListeners", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		n, err := s.NewNotifier(eventsource.NotifierOptions{PollInterval: -1})
		require.NoError(t, err)
		l, err := n.Listen(s.NotifyChannel())
		require.NoError(t, err)
		startNotifier(t, n)
		drainTick(l)
		mustAppend(t, s, "order-1", ev("A", `{}`), ev("B", `{}`))
		sequenceAll(t, s)
		require.True(t, waitTick(l, 5*time.Second))
		require.Equal(t, int64(2), l.Latest(), "the payload is the new head position")
	})

	t.Run("BurstsCoalesceIntoOneTick", func(t *testing.T) {
		t.Parallel()
		ch := randomChannel()
		n, err := eventsource.NewNotifier(pgtest.Pool(t), eventsource.NotifierOptions{Channels: []string{ch}, PollInterval: -1})
		require.NoError(t, err)
		l, err := n.Listen(ch)
		require.NoError(t, err)
		startNotifier(t, n)
		drainTick(l)
		var sql strings.Builder
		for i := 1; i <= 50; i++ {
			fmt.Fprintf(&sql, "SELECT pg_notify('%s', '%d');", ch, i)
		}
		_, err = pgtest.Pool(t).Exec(ctx, sql.String())
		require.NoError(t, err)
		pgtest.Eventually(t, 5*time.Second, func() bool { return n.Stats().Notifications == 50 }, "50 notifications")
		require.Len(t, l.C(), 1, "one pending tick for the whole burst")
		require.Equal(t, int64(50), l.Latest())
		require.Equal(t, int64(50), n.Latest(ch))
	})

	t.Run("TheSafetyPollWakesListenersWhenANotificationIsLost", func(t *testing.T) {
		t.Parallel()
		s := newStore(t)
		// Listen on a channel nobody notifies, with the store's head as the
		// probe: every notification is "lost", only the poll can see news.
		ch := randomChannel()
		n, err := eventsource.NewNotifier(s.Pool(), eventsource.NotifierOptions{
			Channels:     []string{ch},
			Probes:       map[string]eventsource.Probe{ch: s.HeadPosition},
			PollInterval: 20 * time.Millisecond,
		})
		require.NoError(t, err)
		l, err := n.Listen(ch)
		require.NoError(t, err)
		startNotifier(t, n)
		drainTick(l)
		mustAppend(t, s, "order-1", ev("A", `{}`))
		sequenceAll(t, s)
		require.True(t, waitTick(l, 5*time.Second))
		require.Equal(t, int64(1), l.Latest())
		require.GreaterOrEqual(t, n.Stats().PollTicks, int64(1))
		require.Zero(t, n.Stats().Notifications)
	})

	t.Run("ListenersOfOneChannelAreNotWokenByAnother", func(t *testing.T) {
		t.Parallel()
		a, b := randomChannel(), randomChannel()
		n, err := eventsource.NewNotifier(pgtest.Pool(t), eventsource.NotifierOptions{Channels: []string{a, b}, PollInterval: -1})
		require.NoError(t, err)
		la, err := n.Listen(a)
		require.NoError(t, err)
		lb, err := n.Listen(b)
		require.NoError(t, err)
		startNotifier(t, n)
		drainTick(la)
		drainTick(lb)
		notify(t, pgtest.Pool(t), b, "1")
		require.True(t, waitTick(lb, 5*time.Second))
		require.Empty(t, la.C())

		lb.Close()
		lb.Close()
		notify(t, pgtest.Pool(t), b, "2")
		pgtest.Eventually(t, 5*time.Second, func() bool { return n.Stats().Notifications == 2 }, "second notification")
		require.Empty(t, lb.C(), "a closed listener gets no ticks")
	})

	t.Run("AVeryLongSchemaNameStillGetsAWorkingChannel", func(t *testing.T) {
		t.Parallel()
		base := pgtest.NewSchema(t)
		long := base + strings.Repeat("x", 63-len(base))
		t.Cleanup(func() {
			_, _ = pgtest.Pool(t).Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{long}.Sanitize()+" CASCADE")
		})
		s, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: long})
		require.NoError(t, err)
		require.NoError(t, s.Migrate(ctx))
		other, err := eventsource.New(pgtest.Pool(t), eventsource.Config{Schema: long[:62] + "y"})
		require.NoError(t, err)
		require.LessOrEqual(t, len(s.NotifyChannel()), 63)
		require.NotEqual(t, s.NotifyChannel(), other.NotifyChannel())

		n, err := s.NewNotifier(eventsource.NotifierOptions{PollInterval: -1})
		require.NoError(t, err)
		l, err := n.Listen(s.NotifyChannel())
		require.NoError(t, err)
		startNotifier(t, n)
		drainTick(l)
		mustAppend(t, s, "order-1", ev("A", `{}`))
		sequenceAll(t, s)
		require.True(t, waitTick(l, 5*time.Second))
		require.Equal(t, int64(1), l.Latest())
	})

	t.Run("BadOptionsAreRefused", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		probe := func(context.Context) (int64, error) { return 0, nil }
		for name, opts := range map[string]eventsource.NotifierOptions{
			"NoChannels":          {},
			"EmptyChannel":        {Channels: []string{""}},
			"LongChannel":         {Channels: []string{strings.Repeat("c", 64)}},
			"NULInChannel":        {Channels: []string{"a\x00b"}},
			"ProbeOfNoChannel":    {Channels: []string{"a"}, Probes: map[string]eventsource.Probe{"b": probe}},
			"NilProbe":            {Channels: []string{"a"}, Probes: map[string]eventsource.Probe{"a": nil}},
			"BackoffUpsideDown":   {Channels: []string{"a"}, ReconnectMin: time.Second, ReconnectMax: time.Millisecond},
			"InvalidUTF8InChanel": {Channels: []string{"a\xffb"}},
		} {
			_, err := eventsource.NewNotifier(pool, opts)
			var cfgErr *kumierr.ConfigError
			require.ErrorAs(t, err, &cfgErr, name)
		}
		_, err := eventsource.NewNotifier(nil, eventsource.NotifierOptions{Channels: []string{"a"}})
		require.Error(t, err)
		n, err := eventsource.NewNotifier(pool, eventsource.NotifierOptions{Channels: []string{"a"}})
		require.NoError(t, err)
		for _, bad := range []string{"", strings.Repeat("c", 64), "a\x00b", "a\xffb"} {
			_, err = n.Listen(bad)
			var cfgErr *kumierr.ConfigError
			require.ErrorAs(t, err, &cfgErr, "Listen(%q)", bad)
			require.Equal(t, "eventsource channel", cfgErr.Field)
		}
	})

	t.Run("ListenAddsAChannelOnTheLiveConnection", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		first, added := randomChannel(), randomChannel()
		n, err := eventsource.NewNotifier(pool, eventsource.NotifierOptions{Channels: []string{first}, PollInterval: -1})
		require.NoError(t, err)
		startNotifier(t, n)

		l, err := n.Listen(added)
		require.NoError(t, err)
		defer l.Close()
		require.True(t, waitTick(l, 5*time.Second), "a new listener looks once its channel is listened on")
		notify(t, pool, added, "5")
		require.True(t, waitTick(l, 5*time.Second), "a notification on the added channel")
		require.Equal(t, int64(5), l.Latest())

		again, err := n.Listen(added)
		require.NoError(t, err)
		defer again.Close()
		require.True(t, waitTick(again, 5*time.Second), "a second listener of a channel listened on looks at once")
		require.Equal(t, int64(1), n.Stats().Connects, "adding channels does not reconnect")
		require.Equal(t, 1, listenSessions(t, pool, first, added), "one connection listens on both channels")
	})

	t.Run("AFilteredListenerSkipsTheNotificationsItDoesNotKeep", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t)
		ch := randomChannel()
		n, err := eventsource.NewNotifier(pool, eventsource.NotifierOptions{Channels: []string{ch}, PollInterval: -1})
		require.NoError(t, err)
		var seen sync.Map
		mine, err := n.ListenFiltered(ch, func(payload string) bool {
			seen.Store(payload, true)
			return !strings.HasSuffix(payload, ":me")
		})
		require.NoError(t, err)
		defer mine.Close()
		all, err := n.Listen(ch)
		require.NoError(t, err)
		defer all.Close()
		startNotifier(t, n)
		require.True(t, waitTick(mine, 5*time.Second), "connecting wakes filtered listeners too")
		drainTick(all)

		notify(t, pool, ch, "claim:me")
		require.True(t, waitTick(all, 5*time.Second))
		// The listeners are woken in no set order: all may be woken
		// before mine's filter has run.
		pgtest.Eventually(t, 5*time.Second, func() bool { _, ok := seen.Load("claim:me"); return ok },
			"the filter saw the payload")
		require.Empty(t, mine.C(), "its own notification does not wake it")
		notify(t, pool, ch, "claim:other")
		require.True(t, waitTick(mine, 5*time.Second), "another's notification wakes it")
	})
}

// listenSessions returns how many server sessions listen on any of the
// channels: the backends whose last statement was a LISTEN on one of them.
func listenSessions(t *testing.T, pool *pgxpool.Pool, channels ...string) int {
	t.Helper()
	var patterns []string
	for _, c := range channels {
		patterns = append(patterns, "LISTEN "+pgx.Identifier{c}.Sanitize())
	}
	var n int
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_stat_activity WHERE query = ANY($1)", patterns).Scan(&n))
	return n
}

// TestNotifierSurvivesAServerRestart restarts PostgreSQL under a running
// notifier. It uses a server of its own, even when the package's tests run
// on a throwaway server, because restarting the shared one would cut every
// parallel test's connections. With DATABASE_URL set it still needs the
// local server binaries.
func TestNotifierSurvivesAServerRestart(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, err := pgtest.Start(ctx, pgtest.Options{MaxConnections: 20})
	require.NoError(t, err, "this test restarts a PostgreSQL server of its own")
	t.Cleanup(srv.Stop)
	pool, err := pgxpool.New(ctx, srv.URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s, err := eventsource.New(pool, eventsource.Config{})
	require.NoError(t, err)
	require.NoError(t, s.Migrate(ctx))

	n, err := s.NewNotifier(fastReconnect)
	require.NoError(t, err)
	l, err := n.Listen(s.NotifyChannel())
	require.NoError(t, err)
	startNotifier(t, n)
	drainTick(l)
	added := randomChannel()
	la, err := n.Listen(added)
	require.NoError(t, err)
	require.True(t, waitTick(la, 5*time.Second), "the channel added while running is listened on")

	mustAppend(t, s, "order-1", ev("A", `{}`))
	sequenceAll(t, s)
	require.True(t, waitTick(l, 5*time.Second), "a notification before the restart")
	require.Equal(t, int64(1), l.Latest())

	require.NoError(t, srv.Restart(ctx))
	pgtest.Eventually(t, 30*time.Second, func() bool {
		st := n.Stats()
		return st.Connected && st.Connects >= 2
	}, "notifier reconnected after the restart: %+v", n.Stats())
	require.True(t, waitTick(l, 5*time.Second), "reconnecting wakes listeners: notifications may have been lost meanwhile")
	require.True(t, waitTick(la, 5*time.Second), "reconnecting wakes the added channel's listeners too")

	// The pool's old connections died with the server; retry until it has
	// fresh ones.
	pgtest.Eventually(t, 30*time.Second, func() bool {
		_, err := s.Append(ctx, "order-1", eventsource.Any, []eventsource.EventData{ev("B", `{}`)})
		return err == nil
	}, "append after the restart")
	pgtest.Eventually(t, 30*time.Second, func() bool {
		_, err := s.Sequence(ctx)
		return err == nil
	}, "sequence after the restart")
	require.True(t, waitTick(l, 5*time.Second), "a notification after the restart")
	require.Equal(t, int64(2), l.Latest())
	pgtest.Eventually(t, 30*time.Second, func() bool {
		_, err := pool.Exec(ctx, "SELECT pg_notify($1, '9')", added)
		return err == nil
	}, "notify the added channel after the restart")
	require.True(t, waitTick(la, 5*time.Second), "the added channel is listened on again after the restart")
	require.Equal(t, int64(9), la.Latest())
}
