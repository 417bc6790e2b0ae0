// Package termsafe prints what the database holds so that a terminal
// shows it rather than acts on it: [String] escapes a value, [JSON] JSON
// text, and [NewWriter] is the last line of defence of a command's whole
// output. kumi's CLI and the demo's screen print through it.
package termsafe

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Unsafe reports whether a terminal would act on r, or reorder the
// text around it, instead of showing it: the C0 and C1 control
// characters, DEL, the bidirectional controls (U+202E and kin) and the
// line and paragraph separators. utf8.RuneError (an invalid byte) counts.
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) ||
		r == '\u2028' || r == '\u2029' || r == utf8.RuneError
}

// String returns s as a terminal can show it: every character
// Unsafe reports — tab and newline included — is replaced by its
// visible Go escape (\x1b, \a, \r, \n, \u0085, \u202e), and every byte
// that is not UTF-8 by \xNN. Everything kumi's CLI and demo print from the
// database passes through it.
func String(s string) string { return termSafe(s, "") }

// termSafe is String that keeps the characters of keep as they are
// (the layout characters of its caller, "\n\t" say).
func termSafe(s, keep string) string {
	i := strings.IndexFunc(s, func(r rune) bool { return Unsafe(r) && !strings.ContainsRune(keep, r) })
	if i < 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case Unsafe(r) && !strings.ContainsRune(keep, r):
			q := strconv.QuoteRuneToASCII(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// JSON makes JSON text safe for a terminal while keeping it the
// same JSON: encoding/json escapes C0 controls in strings but passes DEL,
// C1 and bidirectional controls through, which can only occur inside
// strings, where \uXXXX means the same character.
func JSON(b []byte) []byte {
	i := bytes.IndexFunc(b, func(r rune) bool { return Unsafe(r) && r != '\n' && r != '\t' })
	if i < 0 {
		return b
	}
	out := append(make([]byte, 0, len(b)+16), b[:i]...)
	for i < len(b) {
		r, size := utf8.DecodeRune(b[i:])
		if Unsafe(r) && r != '\n' && r != '\t' && !(r == utf8.RuneError && size == 1) {
			out = fmt.Appendf(out, `\u%04x`, r)
		} else {
			// An invalid byte stays: encoding/json never writes one.
			out = append(out, b[i:i+size]...)
		}
		i += size
	}
	return out
}

// NewWriter returns a writer that passes text to w with every
// character Unsafe reports, except newline and tab, escaped as
// String does. It is the last line of defence of a command whose
// output holds values from the database: whatever a formatting path
// forgot to escape, no escape sequence reaches the terminal. A UTF-8
// sequence split between two writes is held until the next one (or
// Flush).
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

// Writer is the writer NewWriter returns.
type Writer struct {
	w    io.Writer
	tail []byte // an incomplete UTF-8 sequence at the end of the last write
}

// Write escapes p and writes it; it reports len(p) when the underlying
// write succeeds.
func (t *Writer) Write(p []byte) (int, error) {
	buf := append(t.tail, p...)
	t.tail = nil
	// Hold back a trailing sequence that may yet complete.
	for k := 1; k <= 3 && k <= len(buf); k++ {
		c := buf[len(buf)-k]
		if c < 0x80 {
			break
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(buf[len(buf)-k:]) {
				t.tail = append([]byte(nil), buf[len(buf)-k:]...)
				buf = buf[:len(buf)-k]
			}
			break
		}
	}
	if _, err := io.WriteString(t.w, termSafe(string(buf), "\n\t")); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Flush writes a sequence held back by the last Write, escaped byte by
// byte: no write completed it.
func (t *Writer) Flush() error {
	if len(t.tail) == 0 {
		return nil
	}
	tail := t.tail
	t.tail = nil
	_, err := io.WriteString(t.w, termSafe(string(tail), ""))
	return err
}
