package doccheck

import (
	"regexp"
	"sort"
	"strings"
	"testing"
)

var (
	// makeRule is a rule of the Makefile: "name:" at a line's start, not
	// a variable (":=") and not a file target (bin/golangci-lint).
	makeRule  = regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):([^=]|$)`)
	makePhony = regexp.MustCompile(`(?m)^\.PHONY:(.*)$`)
	// makeRun is a make command where a doc shows one: a code span or a
	// code block's line that starts with it, after "$ " or VAR=value
	// settings.
	makeRun = regexp.MustCompile(`^(?:\$ )?(?:[A-Z_]+=\S+ )*make ([a-z][a-z0-9-]*)`)
)

// targets returns the Makefile's rules and its .PHONY names.
func targets(t *testing.T) (rules, phony map[string]bool) {
	t.Helper()
	mk := read(t, "Makefile")
	rules, phony = map[string]bool{}, map[string]bool{}
	for _, m := range makeRule.FindAllStringSubmatch(mk, -1) {
		rules[m[1]] = true
	}
	for _, m := range makePhony.FindAllStringSubmatch(mk, -1) {
		for _, n := range strings.Fields(m[1]) {
			phony[n] = true
		}
	}
	return rules, phony
}

// The Makefile declares what it has: every .PHONY name has a rule and
// every rule is .PHONY (a "make vet" declared and missing did nothing,
// issue 28).
func TestTheMakefileDeclaresItsRules(t *testing.T) {
	rules, phony := targets(t)
	var missing, undeclared []string
	for n := range phony {
		if !rules[n] {
			missing = append(missing, n)
		}
	}
	for n := range rules {
		if !phony[n] {
			undeclared = append(undeclared, n)
		}
	}
	sort.Strings(missing)
	sort.Strings(undeclared)
	if len(missing) > 0 {
		t.Errorf("Makefile: .PHONY names %v, which have no rule", missing)
	}
	if len(undeclared) > 0 {
		t.Errorf("Makefile: rules %v are not in .PHONY", undeclared)
	}
}

// Every `make TARGET` that README.md and docs/ show is a target of the
// Makefile.
func TestDocsNameOnlyMakeTargetsThatExist(t *testing.T) {
	rules, _ := targets(t)
	for _, doc := range documents(t) {
		text := read(t, doc)
		var runs []string
		for _, b := range fence.FindAllString(text, -1) {
			for _, l := range strings.Split(b, "\n") {
				runs = append(runs, strings.TrimSpace(l))
			}
		}
		for _, q := range quoted.FindAllStringSubmatch(fence.ReplaceAllString(text, ""), -1) {
			runs = append(runs, strings.TrimSpace(q[1]))
		}
		for _, r := range runs {
			if m := makeRun.FindStringSubmatch(r); m != nil && !rules[m[1]] {
				t.Errorf("%s: `%s`: the Makefile has no target %s", doc, r, m[1])
			}
		}
	}
}

var (
	demoFlagDef = regexp.MustCompile(`fs\.[A-Za-z0-9]+Var\(&[^,]+, "([a-z][a-z0-9-]*)"`)
	demoFlags   = regexp.MustCompile(`DEMO_FLAGS="([^"]*)"`)
	demoRun     = regexp.MustCompile(`go run \./cmd/demo((?: [^|&;` + "`" + `]*)?)`)
	flagWord    = regexp.MustCompile(`(?:^|\s)--?([a-z][a-z0-9-]*)`)
)

// The demo's flags that README.md and docs/ show (`make demo
// DEMO_FLAGS="-lease session"`, `go run ./cmd/demo -workers 4`) are flags
// cmd/demo defines.
func TestDocsNameOnlyDemoFlagsThatExist(t *testing.T) {
	defined := map[string]bool{"h": true, "help": true}
	for _, m := range demoFlagDef.FindAllStringSubmatch(read(t, "cmd/demo/main.go"), -1) {
		defined[m[1]] = true
	}
	if len(defined) < 5 {
		t.Fatalf("found only %d flags in cmd/demo/main.go: has the way they are defined changed?", len(defined))
	}
	for _, doc := range documents(t) {
		text := read(t, doc)
		var args []string
		for _, m := range demoFlags.FindAllStringSubmatch(text, -1) {
			args = append(args, m[1])
		}
		for _, m := range demoRun.FindAllStringSubmatch(text, -1) {
			args = append(args, m[1])
		}
		for _, a := range args {
			for _, f := range flagWord.FindAllStringSubmatch(a, -1) {
				if !defined[f[1]] {
					t.Errorf("%s: demo flag -%s: cmd/demo defines no such flag", doc, f[1])
				}
			}
		}
	}
}
