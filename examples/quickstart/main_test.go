package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/examples/internal/exampletest"
	"github.com/kumi-run/kumi/internal/pgtest"
)

func TestMain(m *testing.M) { exampletest.Main(m, "github.com/kumi-run/kumi/examples/quickstart") }

// README.md's embedding program is this file, character for character.
func TestREADMEShowsThisProgram(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	self, err := os.ReadFile("main.go")
	require.NoError(t, err)
	want := strings.Split(string(self), "\n")
	for _, part := range strings.Split(string(readme), "```go\n")[1:] {
		block := strings.Split(part[:strings.Index(part, "```")], "\n")
		if block[0] != want[0] {
			continue
		}
		for i := range min(len(block), len(want)) {
			require.Equal(t, want[i], block[i], "README.md's embedding program differs from examples/quickstart/main.go at its line %d: copy the file into README.md", i+1)
		}
		require.Equal(t, len(want), len(block), "README.md's embedding program and examples/quickstart/main.go differ in length")
		return
	}
	t.Fatalf("README.md has no Go block that starts as examples/quickstart/main.go does (%q): copy the file into README.md", want[0])
}

// Run as README.md says (-once), it handles the event it appended and exits.
func TestOnceHandlesItsDepositAndExits(t *testing.T) {
	t.Parallel()
	db := exampletest.NewDatabase(t)
	p := exampletest.Start(t, db, "-once")
	p.WaitLine(t, "account-42 deposited 10")
	p.Exit(t)
	p = exampletest.Start(t, db, "-once") // again: the first deposit is not handled twice
	p.WaitLine(t, "account-42 deposited 10")
	p.Exit(t)
	handled := 0
	for _, l := range p.Output() {
		if l == "account-42 deposited 10" {
			handled++
		}
	}
	require.Equal(t, 1, handled, "the second run handles its own deposit only")
}

// SIGTERM stops it gracefully: it exits 0, and its checkpoint covers what it
// handled and its leases are released.
func TestSIGTERMStopsItGracefully(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := exampletest.NewDatabase(t)
	p := exampletest.Start(t, db)
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
	require.NoError(t, err)
	pgtest.Eventually(t, exampletest.Wait, func() bool { // once the program has migrated the schema
		_, err := store.Append(ctx, "account-7", eventsource.Any, []eventsource.EventData{{Type: "Deposited", Data: []byte(`{"amount":3}`)}})
		return err == nil
	}, "append to the program's store")
	p.WaitLine(t, "account-7 deposited 3")
	evs, err := store.ReadStream(ctx, "account-7", 0, 1)
	require.NoError(t, err)
	pos := evs[0].Position // given by the sequencer before delivery
	p.Terminate(t)
	p.Exit(t)
	cps, err := store.Checkpoints(ctx, "balances")
	require.NoError(t, err)
	var flushed int64
	for _, c := range cps {
		flushed = max(flushed, c.Position)
	}
	require.Equal(t, pos, flushed, "the stop wrote the checkpoint")
	var owned int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM kumi.lease_buckets WHERE owner IS NOT NULL`).Scan(&owned))
	require.Zero(t, owned, "every lease released")
}

// -once hung while another copy ran and handled the deposit (issue 30): it
// exits once the deposit is handled, by whichever copy holds its bucket.
func TestOnceExitsWhenAnotherCopyHandlesItsDeposit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := exampletest.NewDatabase(t)
	other := exampletest.Start(t, db)
	pool, err := pgxpool.New(ctx, db)
	require.NoError(t, err)
	defer pool.Close()
	pgtest.Eventually(t, exampletest.Wait, func() bool {
		var owned int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM kumi.lease_buckets WHERE owner IS NOT NULL AND expires_at > now()`).Scan(&owned)
		return owned == 16
	}, "the other copy holds all 16 buckets")
	once := exampletest.Start(t, db, "-once")
	once.Exit(t) // before the fix: it waited for a deposit the other copy handled
	other.Terminate(t)
	other.Exit(t)
	handled := 0
	for _, l := range append(once.Output(), other.Output()...) {
		if l == "account-42 deposited 10" {
			handled++
		}
	}
	require.Equal(t, 1, handled, "one of the copies handled it, once")
}
