package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// tally is the final check's count, read from the database: the events of
// the demo's category against the workers' sink.
type tally struct {
	Appended    int64 // events of the category in the store
	Handled     int64 // of them, distinct events in the sink
	Deliveries  int64 // sink deliveries, duplicates included
	Missing     int64 // appended events with no sink row
	DeadLetters int64 // of the missing, the ones the workers dead-lettered
}

// Duplicates is how many deliveries repeated an event already handled.
func (t tally) Duplicates() int64 { return t.Deliveries - t.Handled }

// count reads the tally in one snapshot.
func count(ctx context.Context, db *database, subscription, category string) (tally, error) {
	q := pgx.Identifier{db.schema}.Sanitize()
	var t tally
	err := pgx.BeginTxFunc(ctx, db.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly},
		func(tx pgx.Tx) error {
			return tx.QueryRow(ctx, `SELECT
    (SELECT count(*) FROM `+q+`.events WHERE category = $1),
    (SELECT count(*) FROM `+q+`.sink s JOIN `+q+`.events e ON e.event_id = s.event_id
        WHERE s.subscription = $2 AND e.category = $1),
    (SELECT coalesce(sum(s.deliveries), 0) FROM `+q+`.sink s JOIN `+q+`.events e ON e.event_id = s.event_id
        WHERE s.subscription = $2 AND e.category = $1),
    (SELECT count(*) FROM `+q+`.events e WHERE e.category = $1
        AND NOT EXISTS (SELECT 1 FROM `+q+`.sink s WHERE s.subscription = $2 AND s.event_id = e.event_id)),
    (SELECT count(*) FROM `+q+`.dead_letters d WHERE d.subscription = $2 AND d.replayed_at IS NULL)`,
				category, subscription).Scan(&t.Appended, &t.Handled, &t.Deliveries, &t.Missing, &t.DeadLetters)
		})
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
