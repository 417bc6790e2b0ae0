package observability_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/internal/obsname"
	"github.com/kumi-run/kumi/observability"
)

// obsnames is the file of the names kumi emits.
const obsnames = "../internal/obsname/names.go"

// nameConstants returns the string constants of a names.go (this
// package's, or internal/obsname's) whose identifiers start with one of
// the prefixes, by identifier.
func nameConstants(t *testing.T, file string, prefixes ...string) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	require.NoError(t, err)
	out := map[string]string{}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				for _, p := range prefixes {
					if strings.HasPrefix(name.Name, p) {
						v, err := strconv.Unquote(lit.Value)
						require.NoError(t, err)
						out[name.Name] = v
					}
				}
			}
		}
	}
	return out
}

// TestNamesPrefixed: every span, event, attribute and metric name is under
// kumi. (or the messaging.* conventions), and no two constants share a
// value within a kind.
func TestNamesPrefixed(t *testing.T) {
	for _, kind := range []string{"Span", "Event", "Attr", "Metric"} {
		names := nameConstants(t, obsnames, kind)
		require.NotEmpty(t, names, kind)
		seen := map[string]string{}
		for id, v := range names {
			if strings.HasPrefix(id, "AttrMessaging") {
				assert.True(t, strings.HasPrefix(v, "messaging."), "%s = %q", id, v)
			} else {
				assert.True(t, strings.HasPrefix(v, "kumi."), "%s = %q", id, v)
			}
			if other, dup := seen[v]; dup && kind != "Span" && kind != "Event" {
				t.Errorf("%s and %s are both %q", id, other, v)
			}
			seen[v] = id
		}
	}
	for _, k := range observability.ChangeKinds {
		assert.True(t, strings.HasPrefix(k.SpanName(), "kumi.lease."))
	}
}

// TestDocsListEveryName keeps docs/observability.md in step with internal/obsname and names.go.
func TestDocsListEveryName(t *testing.T) {
	doc, err := os.ReadFile("../docs/observability.md")
	require.NoError(t, err)
	text := string(doc)
	for id, v := range nameConstants(t, obsnames, "Span", "Event", "Attr", "Metric") {
		assert.Contains(t, text, "`"+v+"`", "%s is not documented", id)
	}
	for _, k := range observability.ChangeKinds {
		assert.Contains(t, text, "`"+string(k)+"`", "change kind %s", k)
	}
	for _, v := range []string{
		obsname.PolicyPauseAndResume, obsname.PolicyDropSubscription, obsname.PolicyDropOldest,
		obsname.DirectiveRestart, obsname.DirectiveStop, obsname.DirectiveResume, obsname.DirectiveEscalate,
		string(observability.OutcomeAck), string(observability.OutcomeRetry), string(observability.OutcomeDeadLetter),
		string(observability.OutcomePanic), string(observability.OutcomeTimeout), string(observability.OutcomeCancelled),
	} {
		assert.Contains(t, text, "`"+v+"`")
	}
	for id, v := range nameConstants(t, "names.go", "Lease") {
		assert.Contains(t, text, "`"+v+"`", "%s is not documented", id)
	}
}
