package fuzz_test

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/actors"
	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/kumierr"
	"github.com/kumi-run/kumi/leasestore"
)

func FuzzParseStreamName(f *testing.F) {
	for _, s := range []string{"account-7", "account-7+snapshot", "a-b-c", "-x", "x-", "x-+y", "x+y-z", "", "noseparator",
		"cat-\x00", "ünï-cödé", "a-\u007f", " a-b", "a-b ", strings.Repeat("c", 101) + "-1", "c-" + strings.Repeat("i", 498)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		sn, err := eventsource.ParseStreamName(name)
		if err != nil {
			var ne *eventsource.NameError
			if !errors.As(err, &ne) || !errors.Is(err, eventsource.ErrInvalidName) {
				t.Fatalf("ParseStreamName(%q): error %v is not a *NameError wrapping ErrInvalidName", name, err)
			}
			return
		}
		if sn.Name != name || sn.Category+"-"+sn.ID != name {
			t.Fatalf("ParseStreamName(%q) = %+v: does not split back into the name", name, sn)
		}
		if sn.Category == "" || strings.ContainsAny(sn.Category, "-+") || len(sn.Category) > eventsource.MaxCategoryLength {
			t.Fatalf("ParseStreamName(%q): bad category %q", name, sn.Category)
		}
		if cardinal, _, _ := strings.Cut(sn.ID, "+"); sn.CardinalID != cardinal || sn.CardinalID == "" {
			t.Fatalf("ParseStreamName(%q): cardinal id %q, want the id's prefix before '+' (%q)", name, sn.CardinalID, cardinal)
		}
		if !utf8.ValidString(name) || len(name) > eventsource.MaxStreamNameLength {
			t.Fatalf("ParseStreamName accepted %q: invalid UTF-8 or too long", name)
		}
		for _, r := range name {
			if r < 0x20 || r == 0x7f {
				t.Fatalf("ParseStreamName accepted %q with a control character", name)
			}
		}
		if err := eventsource.ValidateCategory(sn.Category); err != nil {
			t.Fatalf("ParseStreamName(%q) accepted category %q that ValidateCategory refuses: %v", name, sn.Category, err)
		}
	})
}

func FuzzHash(f *testing.F) {
	for _, s := range []string{"", "0", "7", "account", "7+snapshot", "ünïcödé", "日本語", "9223372036854775807"} {
		for _, n := range []int{1, 2, 3, 8, 32, 1000, 1024} {
			f.Add(s, n)
		}
	}
	f.Fuzz(func(t *testing.T, id string, n int) {
		if n < 0 {
			n = -(n + 1)
		}
		n = 1 + n%1024
		h := eventsource.Hash(id)
		if h2 := eventsource.Hash(id); h2 != h {
			t.Fatalf("Hash(%q) not deterministic: %d, %d", id, h, h2)
		}
		sum := md5.Sum([]byte(id))
		if want := int64(binary.BigEndian.Uint64(sum[:8])); h != want {
			t.Fatalf("Hash(%q) = %d, want the first 8 bytes of its MD5 as a big-endian int64 (%d)", id, h, want)
		}
		m := eventsource.BucketOfHash(h, n)
		if m < 0 || m >= n {
			t.Fatalf("BucketOfHash(Hash(%q), %d) = %d, outside [0, %d)", id, n, m, n)
		}
		if m2 := eventsource.BucketOfHash(h, n); m2 != m {
			t.Fatalf("BucketOfHash not deterministic: %d, %d", m, m2)
		}
		if int64(m) != ((h%int64(n))+int64(n))%int64(n) {
			t.Fatalf("BucketOfHash(%d, %d) = %d, not the non-negative remainder", h, n, m)
		}
		if eventsource.BucketOfHash(h, 1) != 0 {
			t.Fatalf("BucketOfHash(%d, 1) != 0", h)
		}
		if sn, err := eventsource.ParseStreamName("c-" + id); err == nil {
			if got := eventsource.BucketOf(sn, n); got != eventsource.BucketOfHash(eventsource.Hash(sn.CardinalID), n) {
				t.Fatalf("BucketOf(%q, %d) = %d, not the bucket of its cardinal id's hash", sn.Name, n, got)
			}
			whole, err := eventsource.ParseStreamName("c-" + sn.CardinalID + "+other")
			if err == nil && eventsource.BucketOf(whole, n) != eventsource.BucketOf(sn, n) {
				t.Fatalf("%q and %q share a cardinal id but not a bucket", sn.Name, whole.Name)
			}
		}
	})
}

// FuzzLeaseConfig: what StartGroup validates — the group options
// (actors.GroupOptions.WithDefaults().Validate()) and then the lease
// configuration (leasestore.New, which validates before it touches its
// pool: given none, a valid configuration ends in its "needs a pool"
// error) — never panics, and a refusal names its field.
func FuzzLeaseConfig(f *testing.F) {
	ms := int64(time.Millisecond)
	f.Add("orders", "w1", 16, 0, int64(0), int64(0), int64(0), 100, 10)
	f.Add("orders", "w1", 16, 1, 1500*ms, 150*ms, 500*ms, 0, 0)
	f.Add("orders", "", 1024, 0, 30000*ms, 30000*ms, 0*ms, 100, 10)
	f.Add("orders", "w", 8, 0, 30000*ms, 10000*ms, 20000*ms, 1, 1)
	f.Add("", "w", 0, 7, -ms, -ms, -ms, -1, -1)
	f.Add("a\x00b", strings.Repeat("w", 201), 65537, 2, ms, 0*ms, ms, 10001, 0)
	f.Add(" s", "w", -3, -1, int64(1<<62), int64(1<<62), int64(1<<62), 5, -5)
	props := actor.PropsFromFunc(func(actor.Context) {})
	f.Fuzz(func(t *testing.T, sub, workerID string, buckets, kind int, ttl, heartbeat, margin int64, batch, queue int) {
		lease := leasestore.LeaseOptions{Kind: leasestore.Kind(kind), TTL: time.Duration(ttl),
			Heartbeat: time.Duration(heartbeat), Margin: time.Duration(margin)}
		o := actors.GroupOptions{Subscription: sub, Category: "acct", Buckets: buckets, Handler: props, Worker: workerID,
			Lease: lease, BatchSize: batch, QueueCapacity: queue}.WithDefaults()
		if err := o.Validate(); err != nil {
			var oe *kumierr.ConfigError
			if !errors.As(err, &oe) || oe.Field == "" || !strings.Contains(err.Error(), oe.Field) {
				t.Fatalf("GroupOptions.Validate: %v does not name its field", err)
			}
			return
		}
		cfg := leasestore.Config{Schema: "kumi", Subscription: o.Subscription, Worker: o.Worker, Buckets: o.Buckets,
			LeaseOptions: leasestore.LeaseOptions{Kind: lease.Kind, TTL: lease.TTL, Heartbeat: lease.Heartbeat, Margin: lease.Margin}}
		_, err := leasestore.New(nil, cfg)
		var ce *kumierr.ConfigError
		switch {
		case err == nil:
			t.Fatal("leasestore.New accepted a nil pool")
		case errors.As(err, &ce):
			if !strings.HasPrefix(ce.Field, "leasestore.Config.") || !strings.Contains(err.Error(), ce.Field) {
				t.Fatalf("leasestore config error %v does not name its field", err)
			}
		default:
			// Accepted: then the documented constraints hold.
			c := cfg.WithDefaults()
			if c.TTL <= 0 || c.Heartbeat <= 0 || c.Margin < 0 || c.Heartbeat >= c.TTL || c.Heartbeat+c.Margin >= c.TTL {
				t.Fatalf("leasestore accepted ttl %v, heartbeat %v, margin %v", c.TTL, c.Heartbeat, c.Margin)
			}
			if c.Kind != leasestore.KindRow && c.Kind != leasestore.KindSession {
				t.Fatalf("leasestore accepted kind %v", c.Kind)
			}
		}
	})
}
