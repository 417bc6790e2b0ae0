// Package godeps lists a package's dependencies with the go command, for
// the tests that keep a package from carrying what it must not (the CLI
// no runtime, the runtime no exporter).
package godeps

import (
	"os/exec"
	"strings"
	"testing"
)

// List returns the import paths `go list -deps` prints for the package in
// dir ("." for the test's own), failing the test when the go command
// fails.
func List(t testing.TB, dir string) []string {
	t.Helper()
	goTool, err := exec.LookPath("go") // go test puts its own first on PATH
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(goTool, "list", "-deps", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", dir, err, out)
	}
	return strings.Fields(string(out))
}
