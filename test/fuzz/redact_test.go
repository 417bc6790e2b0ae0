package fuzz_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kumi-run/kumi/internal/dburl"
	"github.com/kumi-run/kumi/internal/redact"
)

// FuzzConnStringRedaction puts a password into a connection string, broken
// or not, and checks that no message kumi prints about it repeats the
// password: ParseURL's error, and (when it parses) a failed connection's
// message naming what pgx parsed out of it, passed through redact.Conn.
// shape holds "{pw}" where the password goes.
func FuzzConnStringRedaction(f *testing.F) {
	for _, c := range [][2]string{
		{"postgres://kumi:{pw}@host:5432/db", "s3cr3t!Prefix/Tail"},
		{"postgres://kumi:{pw}@host:5432/db", "ab%zzcd!ef"},
		{"postgresql://kumi:{pw}@host/db?sslmode=disable", "p@ss!word@x"},
		{"postgres://kumi:{pw}@host:notaport/db", "hunter2!!"},
		{"postgres://kumi:{pw}@[::1/db", "hunter2!!"},
		{"postgres://kumi:{pw}@h1,h2:5432:5433/db", "hunter2!!"},
		{"postgres://kumi@host/db?password={pw}", "se%zzcret!"},
		{"postgres://kumi@host/db?password={pw}&connect_timeout=x", "a b c!d"},
		{"postgres://kumi:{pw}@host/db?pool_max_conns=0", "hunter2!!"},
		{"host=h user=u password={pw}", "first! second"},
		{"host=h user=u password='{pw}", "unterminated! secret"},
		{"host=h user=u password={pw} port=x", "hunter2!!"},
		{"host=h user=u password={pw} sslmode=sometimes", "a'b!c d"},
		{"user=u password={pw}", "hunter2!!\x00"},
	} {
		f.Add(c[0], c[1])
	}
	f.Fuzz(func(t *testing.T, shape, pw string) {
		// A password worth hiding: long enough, and with a character no
		// fixed part of kumi's messages holds, so that finding it there
		// means it was repeated.
		if len(pw) < 6 || !strings.ContainsAny(pw, "!~^|*$") || !strings.Contains(shape, "{pw}") {
			return
		}
		conn := strings.ReplaceAll(shape, "{pw}", pw)
		cfg, err := dburl.Parse(conn)
		if err != nil {
			var ue *dburl.Error
			if !errors.As(err, &ue) {
				t.Fatalf("ParseURL(%q): %T, want a *URLError", conn, err)
			}
			if strings.Contains(err.Error(), pw) {
				t.Fatalf("ParseURL(%q) repeats the password: %s", conn, err)
			}
			return
		}
		// Where pgx took the shape's password position to hold a host,
		// a user or a database, a failed connection names them.
		cc := cfg.ConnConfig
		msg := fmt.Sprintf("failed to connect to `user=%s database=%s`: %s:%d (%s): dial error: %s",
			cc.User, cc.Database, cc.Host, cc.Port, cc.Host, conn)
		if got := redact.Conn(conn, msg); inPasswordPosition(shape) && strings.Contains(got, pw) {
			t.Fatalf("Redact(%q, …) repeats the password: %s", conn, got)
		}
	})
}

// inPasswordPosition reports whether shape puts the password where a
// connection string's password goes (after the user's ':' in a URL, or
// after password=), rather than, say, in its host name.
func inPasswordPosition(shape string) bool {
	for _, p := range []string{"postgres://", "postgresql://"} {
		if rest, ok := strings.CutPrefix(shape, p); ok {
			user, _, found := strings.Cut(rest, ":{pw}@")
			if found && !strings.ContainsAny(user, "@/:") {
				return true
			}
		}
	}
	return strings.Contains(shape, "password={pw}") || strings.Contains(shape, "password='{pw}")
}
