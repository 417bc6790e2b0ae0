// Package redact masks passwords in the messages kumi prints: those of
// connection strings (URL and key=value) within a message, and every
// piece of a given connection string's password, however a parser split
// it. internal/dburl builds its connection errors on it; observability's
// endpoints pass their errors through it.
package redact

import (
	"cmp"
	"regexp"
	"slices"
	"strings"
)

var urlPassword = regexp.MustCompile(`(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@`)
var kvPassword = regexp.MustCompile(`(password=)\S+`)

// kvSecret finds password and sslpassword values in key=value strings and
// URL queries, quoted or not.
var kvSecret = regexp.MustCompile(`(?i)(?:ssl)?password\s*=\s*('(?:[^'\\]|\\.)*'?|[^\s&]*)`)

// URL replaces passwords in connection strings within s by "xxxxx".
func URL(s string) string {
	s = urlPassword.ReplaceAllString(s, "${1}xxxxx@")
	return kvPassword.ReplaceAllString(s, "${1}xxxxx")
}

// minSecretPiece is the shortest piece of a password that [Conn] masks
// on its own: shorter pieces would mask ordinary words of the message.
const minSecretPiece = 4

// Conn masks, in msg, the passwords of connection strings (as [URL])
// and every piece of conn's password: the whole of it, and
// each part between the separators a parser may have split it at (so a
// password "ab/cdef@host" whose "cdef" became a host name is masked there
// too). Pieces shorter than four characters are left, as they cannot be
// told from the message's own words.
func Conn(conn, msg string) string {
	msg = URL(msg)
	for _, s := range secretPieces(conn) {
		msg = strings.ReplaceAll(msg, s, "xxxxx")
	}
	return msg
}

// secretPieces returns what may be conn's password, longest first: a
// URL's text between the user's ':' and the last '@' before the path (and
// up to the first '@'), password= values, and the pieces of each between
// separators.
func secretPieces(conn string) []string {
	var whole []string
	if rest, ok := CutScheme(conn); ok {
		if colon := strings.IndexByte(rest, ':'); colon >= 0 {
			if at := strings.LastIndexByte(rest, '@'); at > colon {
				whole = append(whole, rest[colon+1:at])
			}
			if at := strings.IndexByte(rest, '@'); at > colon {
				whole = append(whole, rest[colon+1:at])
			}
		}
	}
	for _, m := range kvSecret.FindAllStringSubmatch(conn, -1) {
		whole = append(whole, strings.Trim(m[1], "'"), m[1])
	}
	var out []string
	for _, w := range whole {
		out = append(out, w)
		out = append(out, strings.FieldsFunc(w, func(r rune) bool {
			return strings.ContainsRune("@/:?#&,=[]'\\%", r) || r == ' ' || r == '\t' || r == '\n' || r == '\r'
		})...)
	}
	out = slices.DeleteFunc(out, func(s string) bool { return len(s) < minSecretPiece })
	slices.SortFunc(out, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	return slices.Compact(out)
}

// CutScheme returns conn without its postgres:// or postgresql:// scheme,
// and whether it had one.
func CutScheme(conn string) (string, bool) {
	if rest, ok := strings.CutPrefix(conn, "postgresql://"); ok {
		return rest, true
	}
	return strings.CutPrefix(conn, "postgres://")
}
