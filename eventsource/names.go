package eventsource

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Limits on names and payloads.
const (
	// MaxStreamNameLength is the longest stream name, in bytes.
	MaxStreamNameLength = 500
	// MaxCategoryLength is the longest category, in bytes.
	MaxCategoryLength = 100
	// MaxEventTypeLength is the longest event type, in bytes.
	MaxEventTypeLength = 200
	// MaxSubscriptionNameLength is the longest subscription name, in bytes.
	MaxSubscriptionNameLength = 200
)

// ErrInvalidName is wrapped by every [*NameError].
var ErrInvalidName = errors.New("kumi: invalid name")

// NameError reports a stream, category, type or subscription name that the
// store refuses, and why.
type NameError struct {
	Kind   string // "stream", "category", "event type" or "subscription"
	Name   string // the offending name, truncated to 80 bytes
	Reason string // what is wrong with it
}

// Error describes the refused name.
func (e *NameError) Error() string {
	return fmt.Sprintf("kumi: invalid %s name %q: %s", e.Kind, e.Name, e.Reason)
}

// Unwrap returns [ErrInvalidName].
func (e *NameError) Unwrap() error { return ErrInvalidName }

func nameErr(kind, name, reason string) error {
	if len(name) > 80 {
		cut := 80
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut-- // never in the middle of a character
		}
		name = name[:cut] + "…"
	}
	return &NameError{Kind: kind, Name: name, Reason: reason}
}

// StreamName is a parsed stream name: "category-id", where the category is
// the text before the first '-' and the cardinal id is the id before any '+'
// ("account-7+snapshot" has category "account", id "7+snapshot" and cardinal
// id "7", and shares a bucket with "account-7").
type StreamName struct {
	Name       string // the whole name
	Category   string // before the first '-'
	ID         string // after the first '-'
	CardinalID string // the ID before any '+'
}

// ParseStreamName validates and splits a stream name. It refuses what
// [ValidateName] refuses (an empty or over-long name, invalid UTF-8,
// control and bidirectional formatting characters, white space at either
// end), a missing '-', an empty category or id, and a category or
// cardinal id that is empty or starts the id with '+'.
func ParseStreamName(name string) (StreamName, error) {
	if err := ValidateName("stream", name, MaxStreamNameLength); err != nil {
		return StreamName{}, err
	}
	cat, id, ok := strings.Cut(name, "-")
	if !ok {
		return StreamName{}, nameErr("stream", name, `must have the form "category-id"`)
	}
	if cat == "" {
		return StreamName{}, nameErr("stream", name, "empty category")
	}
	if strings.TrimSpace(cat) != cat {
		return StreamName{}, nameErr("stream", name, "category has leading or trailing white space")
	}
	if len(cat) > MaxCategoryLength {
		return StreamName{}, nameErr("stream", name, fmt.Sprintf("category longer than %d bytes", MaxCategoryLength))
	}
	if strings.Contains(cat, "+") {
		return StreamName{}, nameErr("stream", name, "category contains '+'")
	}
	cardinal, _, _ := strings.Cut(id, "+")
	if cardinal == "" {
		return StreamName{}, nameErr("stream", name, "empty id")
	}
	return StreamName{Name: name, Category: cat, ID: id, CardinalID: cardinal}, nil
}

// ValidateCategory checks a category name as [ParseStreamName] checks the
// category part of a stream name.
func ValidateCategory(category string) error {
	if err := ValidateName("category", category, MaxCategoryLength); err != nil {
		return err
	}
	if strings.ContainsAny(category, "-+") {
		return nameErr("category", category, "contains '-' or '+'")
	}
	return nil
}

// ValidateSubscription checks a subscription name.
func ValidateSubscription(name string) error {
	return ValidateName("subscription", name, MaxSubscriptionNameLength)
}

// ValidateName checks a name by the character rules of every name the
// store takes (stream, category, event type, subscription), for a name of
// the given kind (used in the error) and at most maxLen bytes: it refuses
// an empty or over-long name, invalid UTF-8, a control character (C0,
// DEL or C1: NUL, ESC, newline, tab, U+0085, U+009B…), a bidirectional
// formatting character (U+061C, U+200E, U+200F, U+202A–U+202E,
// U+2066–U+2069), which makes text display other than it reads, and
// leading or trailing white space. The error is a [*NameError] of kind.
// Other packages check their own names (a worker id, say) with it.
func ValidateName(kind, name string, maxLen int) error {
	switch {
	case name == "":
		return nameErr(kind, name, "empty")
	case len(name) > maxLen:
		return nameErr(kind, name, fmt.Sprintf("longer than %d bytes", maxLen))
	case !utf8.ValidString(name):
		return nameErr(kind, name, "not valid UTF-8")
	}
	for _, r := range name {
		if isControl(r) {
			return nameErr(kind, name, fmt.Sprintf("contains the control character %U", r))
		}
		if isBidiControl(r) {
			return nameErr(kind, name, fmt.Sprintf("contains the bidirectional formatting character %U", r))
		}
	}
	if strings.TrimSpace(name) != name {
		return nameErr(kind, name, "leading or trailing white space")
	}
	return nil
}

// isControl reports a C0 or C1 control character, or DEL.
func isControl(r rune) bool { return r < 0x20 || (r >= 0x7f && r <= 0x9f) }

// isBidiControl reports a character that changes the direction of the
// text around it without showing: the Unicode Bidi_Control property.
func isBidiControl(r rune) bool {
	return r == 0x061c || r == 0x200e || r == 0x200f || (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}
