package redact

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestRedactMasksThePiecesOfAPasswordAParserSplit(t *testing.T) {
	t.Parallel()
	// pgx takes the first '@' as the end of the password: "cdef" becomes
	// part of a host name that a failed connection names.
	msg := Conn("postgres://u:ab@cdef@h/db", "failed to connect to `user=u`: hostname resolving error (lookup cdef@h: no such host)")
	require.NotContains(t, msg, "cdef")
	require.Contains(t, msg, "hostname resolving error")
	require.Equal(t, "user=kumi password=xxxxx and xxxxx", Conn("user=kumi password='s3cr3t s3cond'", "user=kumi password=s3cr3t and s3cond"))
	require.Equal(t, "nothing", Conn("", "nothing"))
}

func TestURL(t *testing.T) {
	t.Parallel()
	require.Equal(t, "postgres://u:xxxxx@h/db and password=xxxxx",
		URL("postgres://u:hunter2@h/db and password=hunter2"))
}
