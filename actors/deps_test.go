package actors

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/godeps"
)

// Embedding kumi pulls in no exporter and no gRPC: the OTLP exporters
// and their set-up live in observability/otelsetup, which only a process
// that wants kumi to configure OpenTelemetry imports.
func TestEmbeddingPullsNoExporterAndNoGRPC(t *testing.T) {
	t.Parallel()
	deps := godeps.List(t, ".")
	require.Contains(t, deps, "github.com/kumi-run/kumi/observability", "go list -deps lists the runtime's dependencies")
	var unwanted []string
	for _, d := range deps {
		if strings.Contains(d, "google.golang.org/grpc") || strings.Contains(d, "/exporters/otlp") ||
			d == "github.com/kumi-run/kumi/observability/otelsetup" {
			unwanted = append(unwanted, d)
		}
	}
	require.Empty(t, unwanted, "package actors carries an exporter or gRPC (%d packages in all)", len(deps))
}
