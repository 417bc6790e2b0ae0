package leasestore

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/pgtest"
	"github.com/kumi-run/kumi/kumierr"
)

func TestConfig(t *testing.T) {
	t.Parallel()
	valid := Config{Schema: "s", Subscription: "orders", Buckets: 8}

	t.Run("DefaultsFollowTheTTL", func(t *testing.T) {
		c := valid.WithDefaults()
		require.Equal(t, TTLDefault, c.TTL)
		require.Equal(t, 6*time.Second, c.Heartbeat)
		require.Equal(t, 10*time.Second, c.Margin)
		require.Less(t, 3*c.Heartbeat+c.Margin, c.TTL, "defaults survive one failed renewal")
		c = Config{LeaseOptions: LeaseOptions{TTL: time.Minute}}.WithDefaults()
		require.Equal(t, 12*time.Second, c.Heartbeat)
		require.Equal(t, 20*time.Second, c.Margin)
		require.NoError(t, valid.WithDefaults().validate())
	})

	t.Run("ValidationNamesTheField", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			edit   func(*Config)
			field  string
			reason string
		}{
			{"SchemaMissing", func(c *Config) { c.Schema = "" }, "Schema", "required"},
			{"SubscriptionMissing", func(c *Config) { c.Subscription = "" }, "Subscription", "required"},
			{"SubscriptionWithNUL", func(c *Config) { c.Subscription = "a\x00b" }, "Subscription", "control character U+0000"},
			{"WorkerTooLong", func(c *Config) { c.Worker = strings.Repeat("w", 201) }, "Worker", "200"},
			{"NoBuckets", func(c *Config) { c.Buckets = 0 }, "Buckets", "between 1"},
			{"TooManyBuckets", func(c *Config) { c.Buckets = MaxBuckets + 1 }, "Buckets", "between 1"},
			{"UnknownKind", func(c *Config) { c.Kind = 7 }, "Kind", "KindRow"},
			{"NegativeTTL", func(c *Config) { c.TTL = -time.Second }, "TTL", "between 250ms and 596h31m23.647s"},
			{"TinyTTLRoundsHeartbeatToZero", func(c *Config) { c.TTL = 3 * time.Nanosecond }, "TTL", "between 250ms"},
			// Issue 18: every pass abandoned, thousands of warnings, nothing delivered.
			{"TenMillisecondTTL", func(c *Config) { c.TTL = 10 * time.Millisecond }, "TTL", "between 250ms"},
			// Issue 18: invalid value for parameter "idle_in_transaction_session_timeout".
			{"TwoHundredDayTTL", func(c *Config) { c.TTL = 200 * 24 * time.Hour }, "TTL", "idle_in_transaction_session_timeout"},
			{"ZeroHeartbeatAfterDefaults", func(c *Config) {
				c.TTL, c.Heartbeat, c.Margin = time.Second, -time.Nanosecond, time.Millisecond
			}, "Heartbeat", "positive"},
			// Issue 18: ~10,000 warnings a second.
			{"MicrosecondHeartbeat", func(c *Config) { c.Heartbeat = time.Microsecond }, "Heartbeat", "at least 50ms"},
			{"DefaultHeartbeatIsTTLOverFiveSoTheTTLFloorKeepsItPossible", func(c *Config) {
				c.TTL = MinTTL - time.Millisecond
			}, "TTL", "at least"},
			{"WorkerWithAnEscape", func(c *Config) { c.Worker = "w\x1b[2J" }, "Worker", "control character"},
			{"WorkerWithANewline", func(c *Config) { c.Worker = "w\nx" }, "Worker", "control character"},
			{"WorkerWithAC1Control", func(c *Config) { c.Worker = "w\u009b2J" }, "Worker", "control character"},
			{"WorkerWithNEL", func(c *Config) { c.Worker = "w\u0085" }, "Worker", "control character"},
			{"WorkerWithABidiOverride", func(c *Config) { c.Worker = "w\u202egnp.exe" }, "Worker", "bidirectional"},
			{"WorkerWithABidiIsolate", func(c *Config) { c.Worker = "w\u2066x" }, "Worker", "bidirectional"},
			{"WorkerNotUTF8", func(c *Config) { c.Worker = "w\xff" }, "Worker", "UTF-8"},
			{"SubscriptionWithABidiOverride", func(c *Config) { c.Subscription = "a\u202eb" }, "Subscription", "bidirectional"},
			// Issue 18: one worker collapses at N = 65,536.
			{"SixtyFiveThousandBuckets", func(c *Config) { c.Buckets = 65536 }, "Buckets", "between 1 and 8192"},
			{"NegativeMargin", func(c *Config) { c.Margin = -time.Second }, "Margin", "positive"},
			{"HeartbeatNotUnderTTL", func(c *Config) { c.TTL, c.Heartbeat = time.Second, time.Second }, "Heartbeat", "shorter than TTL"},
			{"HeartbeatPlusMarginNotUnderTTL", func(c *Config) {
				c.TTL, c.Heartbeat, c.Margin = 30*time.Second, 10*time.Second, 20*time.Second
			}, "Margin", "plus Heartbeat"},
			{"DefaultMarginLeavesNoRoomForALongHeartbeat", func(c *Config) {
				c.TTL, c.Heartbeat = 30*time.Second, 25*time.Second
			}, "Margin", "EnsureHeld fails between two renewals"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				c := valid
				tc.edit(&c)
				err := c.WithDefaults().validate()
				var ce *kumierr.ConfigError
				require.ErrorAs(t, err, &ce)
				require.Equal(t, "leasestore.Config."+tc.field, ce.Field)
				require.Contains(t, err.Error(), "Config."+tc.field)
				require.Contains(t, ce.Reason, tc.reason)
				_, err = startedStore(context.Background(), pgtest.Pool(t), c)
				require.ErrorAs(t, err, &ce, "New validates")
			})
		}
	})

	t.Run("LeaseOptionsAloneNameTheirField", func(t *testing.T) {
		for field, o := range map[string]LeaseOptions{
			"Kind":      {Kind: 7},
			"TTL":       {TTL: time.Nanosecond},
			"Heartbeat": {TTL: time.Second, Heartbeat: time.Second},
			"Margin":    {Margin: -time.Second},
		} {
			var ce *kumierr.ConfigError
			require.ErrorAs(t, o.Validate(), &ce, field)
			require.Equal(t, "leasestore.LeaseOptions."+field, ce.Field)
		}
		require.NoError(t, LeaseOptions{}.Validate(), "the defaults")
	})

	t.Run("TheTimingBoundsAreAccepted", func(t *testing.T) {
		for _, o := range []LeaseOptions{
			{TTL: MinTTL}, // default heartbeat TTL/5 = MinHeartbeat
			{TTL: MinTTL, Heartbeat: MinHeartbeat, Margin: MinTTL - MinHeartbeat - time.Nanosecond},
			{TTL: MaxTTL},
			{TTL: MaxTTL, Heartbeat: MaxTTL / 2, Margin: MaxTTL / 4},
		} {
			require.NoError(t, o.Validate(), "%+v", o)
			c := Config{Schema: "s", Subscription: "orders", Buckets: MaxBuckets, Worker: "worker-ü 7", LeaseOptions: o}
			require.NoError(t, c.Validate(), "%+v", c)
		}
	})

	t.Run("TheLongestTTLIsOnePostgreSQLAccepts", func(t *testing.T) {
		b := setup(t)
		c := b.config(KindRow, 2, "a")
		c.TTL = MaxTTL
		s := b.open(t, c)
		res := pass(t, s)
		require.Len(t, res.Owned, 2)
		table := checkpointTable(t, b, 2)
		require.NoError(t, fencedWrite(context.Background(), b.pool, table, s.Fence(0, res.Owned[0].Epoch), 0, 1, "a", res.Owned[0].Epoch))
	})

	t.Run("ATightConfigIsAccepted", func(t *testing.T) {
		c := valid
		c.TTL, c.Heartbeat, c.Margin = 30*time.Second, 9*time.Second, 20*time.Second
		require.NoError(t, c.WithDefaults().validate(), "only heartbeat+margin < ttl is enforced")
	})
}

func TestPoolerDetection(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-p4ss"

	t.Run("AURLThatLooksLikeAPoolerIsJudgedByBehaviourNotRefused", func(t *testing.T) {
		// PgBouncer's default port, a pooled-looking host or parameter say
		// nothing of its pool mode (a session pooler on 6432 is fine): the
		// session is judged when it opens (TestSessionKindBehindARealPgBouncer).
		for _, url := range []string{
			"postgres://app:" + secret + "@ep-cool-darkness-123456-pooler.us-east-2.aws.neon.tech/neondb?sslmode=require",
			"postgres://app:" + secret + "@db.internal:6432/app",
			"host=db.internal port=6432 user=app password=" + secret + " dbname=app",
		} {
			_, err := sessionConfig(url, nil)
			require.NoError(t, err)
		}
	})

	t.Run("ADirectConnectionPasses", func(t *testing.T) {
		cc, err := sessionConfig("postgres://app:"+secret+"@db.internal:5432/app", nil)
		require.NoError(t, err)
		require.Equal(t, "db.internal", cc.Host)
	})

	t.Run("AnUnparsableURLIsRefusedWithoutRepeatingIt", func(t *testing.T) {
		_, err := sessionConfig("postgres://app:"+secret+"@db.internal:notaport/app", nil)
		var ce *kumierr.ConfigError
		require.ErrorAs(t, err, &ce)
		require.Equal(t, "leasestore.Config.SessionURL", ce.Field)
		require.NotContains(t, err.Error(), secret)
		require.NotContains(t, err.Error(), "db.internal")
	})

	t.Run("RowKindIgnoresTheSessionURL", func(t *testing.T) {
		b := setup(t)
		c := b.config(KindRow, 4, "a")
		c.SessionURL = "postgres://app:" + secret + "@db.internal:6432/app"
		b.open(t, c)
	})

	t.Run("SessionKindUsesTheGivenURL", func(t *testing.T) {
		b := setup(t)
		c := b.config(KindSession, 4, "a")
		c.SessionURL = pgtest.URL(t)
		s := b.open(t, c)
		require.Len(t, pass(t, s).Owned, 4)
		require.NoError(t, s.EnsureHeld(0))
	})

	t.Run("TheSameWorkerIdCannotHoldTwoSessions", func(t *testing.T) {
		b := setup(t)
		b.open(t, b.config(KindSession, 4, "twin"))
		_, err := startedStore(context.Background(), b.pool, b.config(KindSession, 4, "twin"))
		require.ErrorIs(t, err, errSessionLockHeld)
	})
}

func TestStatementsAreAllParsed(t *testing.T) {
	t.Parallel()
	st := renderStatements(`we"ird`)
	for _, name := range []string{"worker_heartbeat", "workers_view", "renew", "claim", "place_claims", "guard"} {
		require.Contains(t, st.get(name), `"we""ird".`, name)
	}
	require.Panics(t, func() { st.get("nope") })
	require.Len(t, ChannelName("a", "b"), len("kumi_lease_")+16)
	require.NotEqual(t, ChannelName("a", "bc"), ChannelName("ab", "c"))
	require.Equal(t, pgx.Identifier{"x"}.Sanitize(), `"x"`)
}
