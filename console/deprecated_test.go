package console_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/kumi-run/kumi/console"
)

// The former name still compiles and names the same type.
func TestDeprecatedNamesMeanTheNewOnes(t *testing.T) {
	t.Parallel()
	var m console.Member = console.Worker{Worker: "a", Live: true}
	var w console.Worker = m
	require.Equal(t, "a", w.Worker)
}
