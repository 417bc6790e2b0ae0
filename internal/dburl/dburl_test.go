package dburl

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConnectPoolNeverRepeatsAPassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, want string }{
		{"postgres://admin:hunter2@127.0.0.1:notaport/db", "the port is not a number"},
		{"postgres://admin:hunter2@127.0.0.1:5432/db?sslmode=sometimes", "sslmode"},
		{"host=127.0.0.1 port=x user=admin password=hunter2", "not a valid PostgreSQL connection string"},
		{"", "no database"},
	} {
		_, err := Connect(context.Background(), c.url, 1, "")
		require.Error(t, err, c.url)
		require.Contains(t, err.Error(), c.want)
		require.NotContains(t, err.Error(), "hunter2")
	}
}

// A connection string that does not parse is described without a piece
// of it: pgx's and net/url's messages quote the part they stumbled on,
// which in a broken string is often the password.
func TestParseURLNeverRepeatsAPieceOfThePassword(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ url, secret, want string }{
		// A '/' in the password ends the host part: the rest is a "port".
		{"postgres://kumi:s3cr3tPrefix/Tail@host/db", "s3cr3tPrefix", "%2F"},
		{"postgresql://kumi:s3cr3tPrefix/Tail@host/db", "s3cr3tPrefix", "%2F"},
		// An escape that is not one: pgx quotes "%zz…" in other parts.
		{"postgres://kumi:ab%zzcd@host/db", "%zz", "two hex digits"},
		{"postgres://kumi@host/db?password=ab%zzcd", "%zz", "two hex digits"},
		{"postgres://kumi@host/db?sslpassword=ab%zzcd&x=1", "%zz", "two hex digits"},
		{"postgres://kumi:pw@host/db?passwordsecret", "passwordsecret", "no '='"},
		{"postgres://kumi:se cret@host/db", "se cret", "space"},
		{"postgres://ku%zzmi:pw@host/db", "%zz", "two hex digits"},
		{"postgres://kumi:pass@[::1/db", "pass", "closing ']'"},
		// key=value: an unquoted password with a space leaves a word
		// without '=' that pgx quotes.
		{"host=h user=u password=first second", "second", "no '='"},
		{"host=h user=u password='unterminated secret", "secret", "not closed"},
		{"host=h port=s3cr3t user=u", "s3cr3t", "port"},
		{"host=h password=secret sslmode=s3cr3t", "s3cr3t", "TLS"},
	} {
		_, err := Parse(c.url)
		var ue *Error
		require.ErrorAs(t, err, &ue, c.url)
		require.NotContains(t, err.Error(), c.secret, c.url)
		require.Contains(t, err.Error(), c.want, c.url)
	}
}

func TestRedactErrorOfNilIsNil(t *testing.T) {
	t.Parallel()
	require.NoError(t, RedactError("x", nil))
}
