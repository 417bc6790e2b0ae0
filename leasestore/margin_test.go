package leasestore

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// simulate plays renewals against the margin rule. Renewal k starts at
// k*heartbeat (k ≥ 1; the take at 0 always lands at once); it lands after
// latency unless it is in failed, or latency reaches the heartbeat (a hung
// renewal is abandoned). It checks EnsureHeld every millisecond up to
// horizon and returns the first time it failed (or -1), and the smallest
// distance between an allowed check and the lease's expiry as the
// database sees it (expiry = start of the last renewal that landed + ttl).
func simulate(ttl, heartbeat, margin, latency time.Duration, failed map[int]bool, horizon time.Duration) (firstFail, minRoom time.Duration) {
	usable := usableFor(ttl, margin)
	origin := time.Time{}
	firstFail, minRoom = -1, time.Duration(1<<62)
	for t := time.Duration(0); t <= horizon; t += time.Millisecond {
		// The latest renewal that has landed by t, by start time.
		last := time.Duration(0)
		for k := 1; time.Duration(k)*heartbeat <= t; k++ {
			start := time.Duration(k) * heartbeat
			if failed[k] || latency >= heartbeat || start+latency > t {
				continue
			}
			last = start
		}
		if renewalFresh(reading{mono: origin.Add(last), boot: last}, reading{mono: origin.Add(t), boot: t}, usable) {
			minRoom = min(minRoom, last+ttl-t)
		} else if firstFail < 0 {
			firstFail = t
		}
	}
	return firstFail, minRoom
}

// The lease-row guarantees of kairos-feed-postgres-lease, as table tests.
func TestMarginArithmetic(t *testing.T) {
	t.Parallel()
	s := time.Second
	for _, tc := range []struct {
		name                   string
		ttl, heartbeat, margin time.Duration
		latency                time.Duration
		failed                 map[int]bool
		neverFails             bool
		failsAt                time.Duration // when !neverFails and known exactly
	}{
		{name: "SlowRenewalsNeverFailWhenTwoHeartbeatsPlusMarginFitTheTTL",
			ttl: 30 * s, heartbeat: 6 * s, margin: 10 * s, latency: 6*s - time.Millisecond, neverFails: true},
		{name: "SlowRenewalsCanFailWhenTwoHeartbeatsPlusMarginExceedTheTTL",
			ttl: 30 * s, heartbeat: 12 * s, margin: 10 * s, latency: 11 * s, failsAt: 20 * s},
		{name: "OneFailedRenewalNeverFailsWithTheDefaults",
			ttl: 30 * s, heartbeat: 6 * s, margin: 10 * s, latency: 5 * s, failed: map[int]bool{3: true}, neverFails: true},
		{name: "OneFailedRenewalCanFailWhenThreeHeartbeatsPlusMarginExceedTheTTL",
			ttl: 30 * s, heartbeat: 8 * s, margin: 10 * s, latency: 7 * s, failed: map[int]bool{3: true}, failsAt: 36 * s},
		{name: "AHungRenewalIsAbandonedAndCountsAsOneFailed",
			ttl: 30 * s, heartbeat: 6 * s, margin: 10 * s, latency: 6 * s, failed: map[int]bool{}, failsAt: 20 * s},
		{name: "ManyFailedRenewalsFailTTLMinusMarginAfterTheLastLandedStart",
			ttl: 30 * s, heartbeat: 6 * s, margin: 10 * s, latency: time.Millisecond,
			failed: map[int]bool{2: true, 3: true, 4: true, 5: true, 6: true, 7: true, 8: true, 9: true}, failsAt: 26 * s},
		{name: "InstantRenewalsAtTheConstructionLimitNeverFail",
			ttl: 30 * s, heartbeat: 10 * s, margin: 20*s - time.Millisecond, neverFails: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Schema: "s", Subscription: "x", Buckets: 1, LeaseOptions: LeaseOptions{TTL: tc.ttl, Heartbeat: tc.heartbeat, Margin: tc.margin}}
			require.NoError(t, cfg.WithDefaults().validate(), "every row is a config New accepts")
			firstFail, minRoom := simulate(tc.ttl, tc.heartbeat, tc.margin, tc.latency, tc.failed, 60*s)
			require.GreaterOrEqual(t, minRoom, tc.margin+time.Millisecond,
				"whenever EnsureHeld passes, the lease has more than the margin left")
			if tc.neverFails {
				require.EqualValues(t, -1, firstFail, "EnsureHeld failed at %v", firstFail)
			} else {
				require.Equal(t, tc.failsAt, firstFail)
			}
		})
	}
}

// The same rule, end to end through a Store, with a manual clock.
func TestEnsureHeldMargin(t *testing.T) {
	t.Parallel()
	setupClocked := func(t *testing.T, kind Kind) (*Store, *manualClock) {
		b := setup(t)
		clock := newManualClock()
		c := b.config(kind, 2, "a")
		c.TTL, c.Heartbeat, c.Margin, c.clock = 30*time.Second, 6*time.Second, 10*time.Second, clock
		s := b.open(t, c)
		pass(t, s)
		return s, clock
	}
	failed := func(t *testing.T, s *Store) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_, err := s.Pass(ctx)
		require.Error(t, err)
	}

	t.Run("FailsTTLMinusMarginAfterTheLastRenewalStarted", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			s, clock := setupClocked(t, kind)
			clock.Advance(20*time.Second - time.Nanosecond)
			require.NoError(t, s.EnsureHeld(0))
			clock.Advance(time.Nanosecond)
			err := s.EnsureHeld(0)
			require.ErrorIs(t, err, ErrNotHeld)
			require.Contains(t, err.Error(), "TTL-Margin")
			pass(t, s)
			require.NoError(t, s.EnsureHeld(0), "a renewal that lands makes it usable again")
		})
	})

	t.Run("AgeRunsFromTheStartOfTheRenewal", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			s, clock := setupClocked(t, kind)
			clock.Advance(6 * time.Second)
			pass(t, s)                     // started at 6s...
			clock.Advance(5 * time.Second) // ...and (say) took 5s to land
			clock.Advance(15*time.Second - time.Nanosecond)
			require.NoError(t, s.EnsureHeld(1))
			clock.Advance(time.Nanosecond)
			require.ErrorIs(t, s.EnsureHeld(1), ErrNotHeld, "20s after the START, not after it landed")
		})
	})

	t.Run("OneFailedRenewalIsRiddenOut", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			s, clock := setupClocked(t, kind)
			clock.Advance(6 * time.Second)
			failed(t, s)
			clock.Advance(6 * time.Second)
			require.NoError(t, s.EnsureHeld(0))
			clock.Advance(5 * time.Second) // the next renewal is slow
			require.NoError(t, s.EnsureHeld(0))
			pass(t, s)
			require.NoError(t, s.EnsureHeld(0))
		})
	})

	t.Run("AHostSuspendedPastTheMarginFailsOnResume", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			// The monotonic clock stands still while the host sleeps: by it
			// alone the last renewal is 1s old after a 40s sleep.
			s, clock := setupClocked(t, kind)
			clock.Advance(time.Second)
			clock.Suspend(40 * time.Second)
			err := s.EnsureHeld(0)
			require.ErrorIs(t, err, ErrNotHeld, "the lease has expired (and may be taken) while the host slept")
			require.Contains(t, err.Error(), "TTL-Margin")
			pass(t, s)
			require.NoError(t, s.EnsureHeld(0), "a renewal after the resume makes it usable again")
			clock.Suspend(20*time.Second - time.Nanosecond)
			require.NoError(t, s.EnsureHeld(0), "a short sleep counts like any pause")
			clock.Suspend(time.Nanosecond)
			require.ErrorIs(t, s.EnsureHeld(0), ErrNotHeld)
		})
	})

	t.Run("ManyFailedRenewalsStopTheWorkerAMarginBeforeExpiry", func(t *testing.T) {
		forEachKind(t, func(t *testing.T, kind Kind) {
			s, clock := setupClocked(t, kind)
			for range 3 {
				clock.Advance(6 * time.Second)
				failed(t, s)
				require.NoError(t, s.EnsureHeld(0))
			}
			clock.Advance(2 * time.Second) // 20s since the last renewal that landed
			require.ErrorIs(t, s.EnsureHeld(0), ErrNotHeld)
			require.Len(t, s.Held(), 2, "it still believes it owns them; it just may not act")
		})
	})
}

func TestSystemClockReadsTheBootClock(t *testing.T) {
	t.Parallel()
	var c clock = systemClock{}
	a := c.Boottime()
	b := c.Boottime()
	require.GreaterOrEqual(t, b, a, "it never goes back")
	if runtime.GOOS == "linux" {
		require.Less(t, b, wallClock(), "on Linux it is CLOCK_BOOTTIME (time since boot), not the wall clock")
	}
}

// pausingClock is a manualClock that, once armed, lets one reading
// through and then moves forward by pause: the process paused (SIGSTOP, a
// GC pause, a starved CPU) after its first reading — for instance while
// EnsureHeld waited for the session's answer.
type pausingClock struct {
	*manualClock
	pause atomic.Int64
	reads atomic.Int64
}

func (c *pausingClock) Now() time.Time {
	if d := time.Duration(c.pause.Load()); d > 0 && c.reads.Add(1) == 2 {
		c.Advance(d)
	}
	return c.manualClock.Now()
}

func TestEnsureHeldJudgesTheMomentItAnswers(t *testing.T) {
	t.Parallel()
	// With session evidence, EnsureHeld asks the session whether it still
	// holds its lock: a round trip, during which the process can pause for
	// longer than the margin. Its answer must hold when it is given, not
	// only when the question was asked. (Without it, EnsureHeld reads the
	// clock once and answers at once: there is no round trip to pause in.)
	forKindsWhere(t, withSessionEvidence, func(t *testing.T, kind Kind) {
		b := setup(t)
		clock := &pausingClock{manualClock: newManualClock()}
		c := b.config(kind, 1, "a")
		c.TTL, c.Heartbeat, c.Margin, c.clock = 30*time.Second, 6*time.Second, 10*time.Second, clock
		s := b.open(t, c)
		pass(t, s)
		require.NoError(t, s.EnsureHeld(0))
		clock.Advance(15 * time.Second) // 5s of the 20s usable are left...
		clock.pause.Store(int64(6 * time.Second))
		err := s.EnsureHeld(0) // ...and a 6s pause follows its first reading
		require.ErrorIs(t, err, ErrNotHeld, "usable when asked, but not when answered")
	})
}
