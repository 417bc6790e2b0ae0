package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/godeps"
)

// The operator's CLI reads the tables through eventsource and leasestore;
// it must not carry the runtime (actors, protoactor) nor the OTLP
// exporters, which it never uses: they once came in through
// internal/worker, and made the CLI twice the size.
func TestCLIDoesNotCarryTheRuntime(t *testing.T) {
	t.Parallel()
	deps := godeps.List(t, ".")
	require.Contains(t, deps, "github.com/kumi-run/kumi/leasestore", "go list -deps lists the CLI's dependencies")
	var unwanted []string
	for _, d := range deps {
		if strings.Contains(d, "protoactor") || strings.Contains(d, "/otlp") ||
			d == "github.com/kumi-run/kumi/actors" || d == "github.com/kumi-run/kumi/internal/worker" ||
			d == "github.com/kumi-run/kumi/observability" {
			unwanted = append(unwanted, d)
		}
	}
	require.Empty(t, unwanted, "cmd/kumi depends on the runtime or an exporter (%d packages in all)", len(deps))
}
