package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// tally is the final check's count, read from the database: the events of
// the demo's category against the workers' sink. The sink of the demo's
// subscription holds the events its handlers were given, all of them of
// the category (the only one the subscription reads) and of the store: an
// appended event without a sink row is missing.
type tally struct {
	Appended    int64 // events of the category in the store
	Handled     int64 // of them, distinct events in the sink
	Deliveries  int64 // sink deliveries, duplicates included
	Missing     int64 // appended events with no sink row
	DeadLetters int64 // of the missing, the ones the workers dead-lettered
}

// Duplicates is how many deliveries repeated an event already handled.
func (t tally) Duplicates() int64 { return t.Deliveries - t.Handled }

// count reads the tally in one snapshot: the store's side through
// eventsource, the sink's with the sink's own statement.
func count(ctx context.Context, db *database, subscription, category string) (tally, error) {
	var t tally
	err := pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			var err error
			if t.Appended, err = db.store.CountCategoryTx(ctx, tx, category); err != nil {
				return err
			}
			stats, err := db.store.SubscriptionsTx(ctx, tx)
			if err != nil {
				return err
			}
			for _, s := range stats {
				if s.Subscription == subscription {
					t.DeadLetters = int64(s.DeadLetters)
				}
			}
			return tx.QueryRow(ctx, `SELECT count(*), coalesce(sum(deliveries), 0) FROM `+
				pgx.Identifier{db.schema}.Sanitize()+`.sink WHERE subscription = $1`, subscription).
				Scan(&t.Handled, &t.Deliveries)
		})
	t.Missing = max(t.Appended-t.Handled, 0)
	return t, err
}

// verdict is the demo's last line and whether the run passed: nothing may
// be missing, and with exactly-once nothing may be delivered twice.
func (t tally) verdict(exactly bool) (string, bool) {
	dups := fmt.Sprintf("%d duplicates", t.Duplicates())
	switch {
	case exactly:
		dups += ", expected none with -exactly-once"
	case t.Duplicates() > 0:
		dups += ": at-least-once redelivery after the kill, see docs/guarantees.md"
	}
	line := fmt.Sprintf("check: appended %d, handled %d distinct, %d deliveries (%s)",
		t.Appended, t.Handled, t.Deliveries, dups)
	switch {
	case t.Missing > 0:
		dl := ""
		if t.DeadLetters > 0 {
			dl = fmt.Sprintf(", %d dead-lettered (kumi dead-letters list)", t.DeadLetters)
		}
		return line + fmt.Sprintf(" — FAILED: %d events were not handled%s", t.Missing, dl), false
	case exactly && t.Duplicates() > 0:
		return line + " — FAILED: duplicates despite -exactly-once", false
	}
	return line + " — nothing lost", true
}
