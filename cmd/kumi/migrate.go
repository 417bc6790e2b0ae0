package main

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/leasestore"
)

type migrateCmd struct {
	GroupSize []int `name:"group-size" placeholder:"N" help:"Also build the consumer-group index for subscriptions of N buckets (repeatable). Workers build it when they start otherwise; on a large store build it ahead."`
}

// Run applies the migrations and builds the asked-for indexes.
func (m *migrateCmd) Run(e *env) error {
	for _, n := range m.GroupSize {
		if n < 1 || n > leasestore.MaxBuckets {
			return usageErrorf("--group-size %d: must be between 1 and %d", n, leasestore.MaxBuckets)
		}
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	if err := store.Migrate(e.ctx); err != nil {
		return fmt.Errorf("event store: %w", err)
	}
	if err := leasestore.Migrate(e.ctx, store.Pool(), store.Schema()); err != nil {
		return fmt.Errorf("lease store: %w", err)
	}
	for _, n := range m.GroupSize {
		if err := store.EnsureConsumerGroupIndex(e.ctx, n); err != nil {
			return err
		}
	}
	rows, _ := store.Pool().Query(e.ctx, `SELECT component || ' version ' || max(version) FROM `+
		store.QuotedSchema()+`.schema_migrations GROUP BY component ORDER BY component`)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "schema %q is up to date: %s\n", store.Schema(), strings.Join(versions, ", "))
	for _, n := range m.GroupSize {
		fmt.Fprintf(e.stdout, "consumer-group index for %d buckets: present\n", n)
	}
	return nil
}
