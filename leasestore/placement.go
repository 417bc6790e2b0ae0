package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
)

// place puts two-phase claims on live owners' surplus, so that this worker
// (at have, counting its pending claims) reaches the fair share: first on
// what owners hold above the share, then, while this worker is below
// floor(N/live), on what they hold above the floor. Placements of one
// subscription are serialised by a transaction lock, so two claimants never
// count the same surplus, and joiners arriving together all place at once.
// It works on one generation's buckets (during a resize each active
// generation is balanced on its own).
func (s *Store) place(ctx context.Context, tx txConn, generation, have, share, floor int, live map[string]bool) ([]Request, error) {
	// Everything that may wait for a lock runs in a savepoint with a short
	// lock_timeout: the placement lock (another placer may hold it while it
	// waits for rows this pass holds: during a resize a pass places in two
	// generations, under one placement lock) and the owners' rows (an
	// owner's pass holding them). A wait that runs out, or a deadlock
	// PostgreSQL breaks here, makes this pass place nothing; nothing else
	// fails. placeIn opens the savepoint in its first batch.
	placed, err := s.placeIn(ctx, tx, generation, have, share, floor, live)
	if err != nil {
		if _, rbErr := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT "+placeSavepoint); rbErr != nil || ctx.Err() != nil {
			return nil, errors.Join(err, rbErr)
		}
		s.log.Debug("lease claims not placed: owners or placers busy", "err", err)
		return nil, nil
	}
	// The lock_timeout stays for the rest of the transaction.
	if _, err := tx.Exec(ctx, "RELEASE SAVEPOINT "+placeSavepoint); err != nil {
		return nil, err
	}
	sort.Slice(placed, func(i, j int) bool { return placed[i].Bucket < placed[j].Bucket })
	for _, q := range placed {
		s.log.Info("lease claim placed on surplus", "bucket", q.Bucket, "owner", q.Owner)
	}
	return placed, nil
}

// placeSavepoint is the savepoint place works in.
const placeSavepoint = "kumi_place"

// placeIn is place's work, in the savepoint placeSavepoint, which it opens
// first in its batch.
func (s *Store) placeIn(ctx context.Context, sp txConn, generation, have, share, floor int, live map[string]bool) ([]Request, error) {
	wait := min(s.cfg.Heartbeat/4, time.Second)
	b := &pgx.Batch{}
	b.Queue("SAVEPOINT " + placeSavepoint)
	b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", max(wait.Milliseconds(), 1)))
	b.Queue(s.st.get("placement_lock"), s.keys.place)
	b.Queue(s.st.get("loads"), s.cfg.Subscription, s.cfg.Worker, generation)
	br := sp.SendBatch(ctx, b)
	for range 3 {
		if _, err := br.Exec(); err != nil {
			_ = br.Close()
			return nil, err
		}
	}
	type load struct {
		worker     string
		free, load int
	}
	rows, _ := br.Query()
	loads, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (load, error) {
		var l load
		err := r.Scan(&l.worker, &l.free, &l.load)
		return l, err
	})
	if err := errors.Join(err, br.Close()); err != nil {
		return nil, err
	}
	loads = slices.DeleteFunc(loads, func(l load) bool { return !live[l.worker] })
	takes := map[string]int{}
	// take moves one bucket at a time from the most loaded owner above limit.
	take := func(limit, upTo int) {
		for have < upTo {
			best := -1
			for i, l := range loads {
				if l.free > 0 && l.load > limit && (best < 0 || l.load > loads[best].load ||
					(l.load == loads[best].load && l.worker < loads[best].worker)) {
					best = i
				}
			}
			if best < 0 {
				return
			}
			loads[best].free--
			loads[best].load--
			takes[loads[best].worker]++
			have++
		}
	}
	take(share, share)
	take(floor, floor)
	if len(takes) == 0 {
		return nil, nil
	}
	owners := make([]string, 0, len(takes))
	counts := make([]int32, 0, len(takes))
	for w, k := range takes {
		owners, counts = append(owners, w), append(counts, int32(k))
	}
	rows, _ = sp.Query(ctx, s.st.get("place_claims"), s.cfg.Subscription, s.cfg.Worker, owners, counts, generation)
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Request, error) {
		var q Request
		err := r.Scan(&q.Bucket, &q.Owner)
		return q, err
	})
}
