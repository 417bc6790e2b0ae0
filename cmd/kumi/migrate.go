package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/leasestore"
)

type migrateCmd struct {
	Retention time.Duration `name:"ownership-retention" placeholder:"DURATION" help:"Also set how long the ownership record (kumi status --history) keeps a change: 168h, 720h (migrations start it at 7 days)."`
	GroupSize []int         `name:"group-size" placeholder:"N" help:"Also build the consumer-group index for subscriptions of N buckets (repeatable). Workers build it when they start otherwise; on a large store build it ahead."`
}

// Run applies the migrations and builds the asked-for indexes, and says
// whether it created the schema, upgraded it, or found it up to date.
func (m *migrateCmd) Run(e *env) error {
	for _, n := range m.GroupSize {
		if n < 1 || n > leasestore.MaxBuckets {
			return usageErrorf("--group-size %d: must be between 1 and %d", n, leasestore.MaxBuckets)
		}
	}
	if m.Retention < 0 {
		return usageErrorf("--ownership-retention %v: must not be negative", m.Retention)
	}
	store, err := e.connect()
	if err != nil {
		return err
	}
	existed, err := migrate.SchemaExists(e.ctx, store.Pool(), store.Schema())
	if err != nil {
		return err
	}
	before := ""
	if existed {
		if before, err = versions(e, store); err != nil {
			return err
		}
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
	if m.Retention > 0 {
		if err := leasestore.SetOwnershipRetention(e.ctx, store.Pool(), store.Schema(), m.Retention); err != nil {
			return err
		}
	}
	after, err := versions(e, store)
	if err != nil {
		return err
	}
	switch {
	case !existed:
		fmt.Fprintf(e.stdout, "created schema %q: %s\n", store.Schema(), after)
	case before != after:
		fmt.Fprintf(e.stdout, "schema %q migrated to %s (was: %s)\n", store.Schema(), after, orNone(before))
	default:
		fmt.Fprintf(e.stdout, "schema %q is up to date: %s\n", store.Schema(), after)
	}
	if m.Retention > 0 {
		fmt.Fprintf(e.stdout, "ownership record: keeps changes for %v\n", m.Retention)
	}
	for _, n := range m.GroupSize {
		fmt.Fprintf(e.stdout, "consumer-group index for %d buckets: present\n", n)
	}
	return nil
}

// versions is the schema's migration versions, "eventsource version 2,
// leasestore version 2", or "" before any migration.
func versions(e *env, store *eventsource.Store) (string, error) {
	vs, err := migrate.Versions(e.ctx, store.Pool(), store.Schema())
	if err != nil {
		return "", err
	}
	names := make([]string, len(vs))
	for i, v := range vs {
		names[i] = v.String()
	}
	return strings.Join(names, ", "), nil
}

func orNone(s string) string {
	if s == "" {
		return "no kumi tables"
	}
	return s
}
