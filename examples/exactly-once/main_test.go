package main

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/examples/internal/exampletest"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { exampletest.Main(m, "github.com/kumi-run/kumi/examples/exactly-once") }

// Each -once run applies its own deposit, once: two runs, a balance of 20.
func TestEachDepositIsAppliedOnce(t *testing.T) {
	t.Parallel()
	db := exampletest.NewDatabase(t)
	p := exampletest.Start(t, db, "-once")
	p.WaitLine(t, "account-42 deposited 10, balance 10")
	p.Exit(t)
	p = exampletest.Start(t, db, "-once")
	p.WaitLine(t, "account-42 deposited 10, balance 20")
	p.Exit(t)
	require.Len(t, p.Output(), 1, "the second run applied its own deposit only")
}

// Deposits appended while it runs are applied once each, and SIGTERM
// stops it with the projection and the checkpoints in step.
func TestAProjectionOfManyDepositsIsExact(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := exampletest.NewDatabase(t)
	p := exampletest.Start(t, db)
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
	require.NoError(t, err)
	pgtest.Eventually(t, exampletest.Wait, func() bool {
		var ok bool
		return pool.QueryRow(ctx, `SELECT to_regclass('account_balances') IS NOT NULL`).Scan(&ok) == nil && ok
	}, "the program has created its table")
	const accounts, deposits = 8, 200
	for i := range deposits {
		_, err := store.Append(ctx, fmt.Sprintf("account-%d", i%accounts), eventsource.Any,
			[]eventsource.EventData{{Type: "Deposited", Data: []byte(`{"amount":1}`)}})
		require.NoError(t, err)
	}
	var total int
	pgtest.Eventually(t, exampletest.Wait, func() bool {
		_ = pool.QueryRow(ctx, `SELECT coalesce(sum(total), 0) FROM account_balances`).Scan(&total)
		return total == deposits
	}, "every deposit applied (got %d)", total)
	p.Terminate(t)
	p.Exit(t)
	var rows, wrong int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE total <> $1) FROM account_balances`,
		deposits/accounts).Scan(&rows, &wrong))
	require.Equal(t, accounts, rows)
	require.Zero(t, wrong, "each account's deposits applied once")
}
