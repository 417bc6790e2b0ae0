package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// BuildBinary builds the Go package pkg (an import path) into an
// executable named name, next to the running test binary — in go test's own
// temporary directory, removed when the run ends — or in a fresh temp dir.
// It builds with the race detector when the calling test binary has it, so
// a race inside a process under test fails the run too. Call it from
// TestMain, before [Main].
func BuildBinary(pkg, name string) (string, error) {
	goTool, err := exec.LookPath("go") // go test puts its own first on PATH
	if err != nil {
		return "", err
	}
	dir := ""
	if exe, err := os.Executable(); err == nil {
		dir = filepath.Dir(exe)
	}
	if f, err := os.CreateTemp(dir, "probe"); err == nil {
		_ = f.Close()
		_ = os.Remove(f.Name())
	} else if dir, err = os.MkdirTemp("", "kumi-bin-"); err != nil {
		return "", err
	}
	out := filepath.Join(dir, name)
	args := []string{"build", "-o", out}
	if RaceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goTool, append(args, pkg)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %v\n%s", pkg, err, b)
	}
	return out, nil
}
