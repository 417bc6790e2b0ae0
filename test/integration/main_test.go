package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// workerBin is the worker binary the scenarios run, and kumiBin the
// operator's CLI (cmd/kumi), each built once by TestMain.
var workerBin, kumiBin string

func TestMain(m *testing.M) {
	bin, err := pgtest.BuildBinary("github.com/kumi-run/kumi/test/integration/workerbin", "kumi-workerbin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: build the worker binary:", err)
		os.Exit(2)
	}
	workerBin = bin
	if kumiBin, err = pgtest.BuildBinary("github.com/kumi-run/kumi/cmd/kumi", "kumi"); err != nil {
		fmt.Fprintln(os.Stderr, "integration: build the kumi CLI:", err)
		os.Exit(2)
	}
	pgtest.Main(m)
}
