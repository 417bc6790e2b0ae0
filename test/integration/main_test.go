package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"go.uber.org/goleak"

	"github.com/kumi-run/kumi/internal/pgtest"
)

// workerBin is the worker binary the scenarios run, built once by TestMain.
var workerBin string

func TestMain(m *testing.M) {
	bin, err := buildWorker()
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration: build the worker binary:", err)
		os.Exit(2)
	}
	workerBin = bin
	pgtest.Main(m,
		// protoactor's dead-letter throttle (in-process scenarios) ends its
		// goroutine one period after the last dead letter, which may be
		// after the tests end.
		goleak.IgnoreTopFunction("github.com/asynkron/protoactor-go/actor.NewDeadLetter.NewThrottle.func4.1"),
	)
}

// buildWorker builds ./workerbin next to the test binary (go test's own
// temporary directory, removed when the run ends), with the race detector
// when the tests have it, so a race inside a worker process fails the run
// too (see cluster.checkLogs).
func buildWorker() (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir := ""
	if exe, err := os.Executable(); err == nil {
		dir = filepath.Dir(exe)
	}
	if f, err := os.CreateTemp(dir, "probe"); err == nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
	} else if dir, err = os.MkdirTemp("", "kumi-workerbin-"); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "kumi-workerbin")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/kumi-run/kumi/test/integration/workerbin")
	cmd := exec.Command(goTool, args...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%v\n%s", err, b)
	}
	return out, nil
}
