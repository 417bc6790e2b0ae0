package main

import (
	"testing"

	"github.com/kumi-run/kumi/examples/internal/exampletest"
)

func TestMain(m *testing.M) { exampletest.Main(m, "github.com/kumi-run/kumi/examples/actor-handler") }

// With -once it handles the deposit it appended and exits; a second run
// handles its own only.
func TestOnceHandlesItsDepositAndExits(t *testing.T) {
	t.Parallel()
	db := exampletest.NewDatabase(t)
	p := exampletest.Start(t, db, "-once")
	p.WaitLine(t, "account-42 deposited 10, balance 10")
	p.Exit(t)
	p = exampletest.Start(t, db, "-once")
	p.WaitLine(t, "account-42 deposited 10, balance 10") // a new actor: the balance lives in memory
	p.Exit(t)
	if n := len(p.Output()); n != 1 {
		t.Fatalf("the second run printed %d lines, want its own deposit only: %q", n, p.Output())
	}
}
