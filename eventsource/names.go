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
		name = name[:80] + "…"
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

// ParseStreamName validates and splits a stream name. It refuses an empty or
// over-long name, invalid UTF-8, control characters (NUL included), a missing
// '-', an empty category or id, and a category or cardinal id that is empty
// or starts the id with '+'.
func ParseStreamName(name string) (StreamName, error) {
	if err := checkText("stream", name, MaxStreamNameLength); err != nil {
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
	if err := checkText("category", category, MaxCategoryLength); err != nil {
		return err
	}
	if strings.ContainsAny(category, "-+") {
		return nameErr("category", category, "contains '-' or '+'")
	}
	return nil
}

// ValidateSubscription checks a subscription name.
func ValidateSubscription(name string) error {
	return checkText("subscription", name, MaxSubscriptionNameLength)
}

func checkText(kind, s string, max int) error {
	switch {
	case s == "":
		return nameErr(kind, s, "empty")
	case len(s) > max:
		return nameErr(kind, s, fmt.Sprintf("longer than %d bytes", max))
	case !utf8.ValidString(s):
		return nameErr(kind, s, "not valid UTF-8")
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return nameErr(kind, s, "contains a control character")
		}
	}
	if strings.TrimSpace(s) != s {
		return nameErr(kind, s, "leading or trailing white space")
	}
	return nil
}
