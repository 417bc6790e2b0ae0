package termsafe

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hostile holds what a terminal acts on: ESC, BEL, CR, a C1 CSI, NEL,
// DEL, a bidi override, a tab, a newline and an invalid byte.
const hostile = "w\x1b[2J\a\r\u009b31m\u0085\x7f\u202eevil\t\n\xff"

func TestTermSafeEscapesWhatATerminalActsOn(t *testing.T) {
	t.Parallel()
	require.Equal(t, `w\x1b[2J\a\r\u009b31m\u0085\x7f\u202eevil\t\n\xff`, String(hostile))
	require.Equal(t, "plain ✗ → ok", String("plain ✗ → ok"))
}

func TestTermWriterKeepsLayoutAndSplitRunes(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	w := NewWriter(&b)
	in := []byte("a\tb\n✗" + hostile)
	for i := range in { // one byte at a time: every rune split
		_, err := w.Write(in[i : i+1])
		require.NoError(t, err)
	}
	require.NoError(t, w.Flush())
	require.Equal(t, "a\tb\n✗"+`w\x1b[2J\a\r\u009b31m\u0085\x7f\u202eevil`+"\t\n"+`\xff`, b.String())
}

func TestTermSafeJSONStaysTheSameJSON(t *testing.T) {
	t.Parallel()
	raw, err := json.Marshal(map[string]string{"v": strings.ToValidUTF8(hostile, "?")})
	require.NoError(t, err)
	safe := JSON(raw)
	for _, r := range string(safe) {
		require.False(t, Unsafe(r), "%q in %s", r, safe)
	}
	var back map[string]string
	require.NoError(t, json.Unmarshal(safe, &back))
	require.Equal(t, strings.ToValidUTF8(hostile, "?"), back["v"])
}
