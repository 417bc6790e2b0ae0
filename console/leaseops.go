package console

// LEASE SQL KEPT HERE FOR NOW. The relinquish action places the first phase
// of leasestore's two-phase handoff — a pending claim — as `kumi
// relinquish` does (cmd/kumi/relinquish.go), whose logic lives in package
// main and so cannot be called. leasestore offers no operator function for
// it yet; when it does, this file goes and relinquish calls it.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"sort"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/worker"
	"github.com/kumi-run/kumi/leasestore"
)

// relinquish asks the owner of bucket to hand it over to the live member
// to (or, when to is "", the least loaded live member other than the
// owner), with the same refusals as `kumi relinquish`: a free or expired
// bucket, one with a pending claim already, a target that is the owner or
// not a live member, and a subscription with no other live worker.
func relinquish(ctx context.Context, store *eventsource.Store, sub string, bucket int, to string) (string, error) {
	in, err := worker.Inspect(ctx, store, sub, "")
	if err != nil {
		return "", err
	}
	if in.Buckets == 0 {
		return "", refuse(http.StatusNotFound, "subscription %q has no buckets: no worker has started it", sub)
	}
	if bucket >= in.Buckets {
		return "", refuse(http.StatusBadRequest, "bucket %d: subscription %q has buckets 0 to %d", bucket, sub, in.Buckets-1)
	}
	var row worker.BucketRow
	for _, r := range in.Rows {
		if r.Bucket == bucket {
			row = r
		}
	}
	switch {
	case row.Owner == "":
		return "", refuse(http.StatusConflict, "bucket %d has no owner: nothing to hand over (a worker below its fair share claims it on its next pass)", bucket)
	case !row.Live:
		return "", refuse(http.StatusConflict, "bucket %d's lease (owner %s) has expired: the next pass of any worker takes it without a handoff", bucket, row.Owner)
	case row.ClaimWorker != "":
		return "", refuse(http.StatusConflict, "bucket %d already has a pending claim by %s: its owner %s is handing it over", bucket, row.ClaimWorker, row.Owner)
	}
	load := map[string]int{}
	live := map[string]bool{}
	for _, m := range in.Members {
		if m.Live && !m.SessionGone {
			live[m.Worker] = true
		}
	}
	for _, r := range in.Rows {
		if r.Live {
			load[r.Owner]++
		}
		if r.ClaimWorker != "" {
			load[r.ClaimWorker]++
		}
	}
	switch {
	case to == row.Owner:
		return "", refuse(http.StatusBadRequest, "%s is the bucket's owner", to)
	case to != "" && !live[to]:
		return "", refuse(http.StatusBadRequest, "%s is not a live member of %q", to, sub)
	case to == "":
		var candidates []string
		for w := range live {
			if w != row.Owner {
				candidates = append(candidates, w)
			}
		}
		if len(candidates) == 0 {
			return "", refuse(http.StatusConflict, "%s is the only live worker of %q: nobody could take bucket %d", row.Owner, sub, bucket)
		}
		sort.Slice(candidates, func(i, j int) bool {
			if load[candidates[i]] != load[candidates[j]] {
				return load[candidates[i]] < load[candidates[j]]
			}
			return candidates[i] < candidates[j]
		})
		to = candidates[0]
	}

	var owner string
	var epoch int64
	q := store.QuotedSchema()
	err = pgx.BeginFunc(ctx, store.Pool(), func(tx pgx.Tx) error {
		// The owner's renewal may hold the row for a moment; never wait long.
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '5s'"); err != nil {
			return err
		}
		err := tx.QueryRow(ctx, `UPDATE `+q+`.lease_buckets l SET claim_worker = $3, claimed_at = now()
WHERE l.subscription = $1 AND l.bucket = $2
  AND l.owner IS NOT NULL AND l.owner <> $3 AND l.expires_at > now() AND l.claim_worker IS NULL
  AND EXISTS (SELECT 1 FROM `+q+`.lease_members m
              WHERE m.subscription = l.subscription AND m.worker = $3 AND m.expires_at > now())
RETURNING l.owner, l.epoch`, sub, bucket, to).Scan(&owner, &epoch)
		if err != nil {
			return err
		}
		// Wake the workers at once (leasestore's channel, docs/leases.md);
		// without it they see the claim on their next pass.
		_, err = tx.Exec(ctx, "SELECT pg_notify($1, $2)", leaseChannel(store.Schema(), sub), "request:kumi-console")
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return "", refuse(http.StatusConflict, "bucket %d changed while the claim was placed (owner, claim or %s's membership): look again and retry", bucket, to)
	}
	if err != nil {
		return "", fmt.Errorf("place the claim: %w", err)
	}
	msg := fmt.Sprintf("asked %s to hand bucket %d (epoch %d) over to %s", owner, bucket, epoch, to)
	if share := leasestore.FairShare(in.Buckets, max(in.LiveMembers(), 1)); load[to] >= share {
		msg += fmt.Sprintf("; %s already holds its fair share (%d of %d), so it may withdraw the claim and %s keep the bucket",
			to, load[to], share, owner)
	}
	return msg, nil
}

// leaseChannel is leasestore's NOTIFY channel for a subscription (see
// leasestore/sql.go, channelName). A mismatch would only cost the wake-up:
// workers poll every heartbeat.
func leaseChannel(schema, subscription string) string {
	h := fnv.New64a()
	_, _ = h.Write([]byte(schema + "\x00" + subscription))
	return fmt.Sprintf("kumi_lease_%016x", h.Sum64())
}
