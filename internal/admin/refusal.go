package admin

import (
	"errors"
	"fmt"
)

// Kind says why an action was refused, as the console's HTTP status and
// the CLI's exit status tell it.
type Kind int

const (
	// BadInput: the request names a bucket, position or event wrongly
	// (HTTP 400; the CLI's usage error).
	BadInput Kind = iota + 1
	// NotFound: the subscription, the letter or the parked stream does not
	// exist (HTTP 404).
	NotFound
	// Conflict: the state forbids the action now (HTTP 409).
	Conflict
)

// The reasons of a [Refusal]; errors.Is finds them in it.
var (
	ErrUnknownSubscription = errors.New("admin: unknown subscription")
	ErrBadBucket           = errors.New("admin: buckets are numbered from 0")
	ErrBadPosition         = errors.New("admin: positions are >= 0")
	ErrNoBuckets           = errors.New("admin: no buckets selected")
	ErrBucketOutOfRange    = errors.New("admin: bucket out of range")
	ErrPastHead            = errors.New("admin: position past the store's head")
	ErrBucketsUnknown      = errors.New("admin: the subscription's bucket count is unknown")
	ErrHeld                = errors.New("admin: a live owner holds the bucket")
	ErrHandoffRefused      = errors.New("admin: handoff refused")
	ErrAlreadyReplayed     = errors.New("admin: the letter was already replayed")
	ErrNotReplayed         = errors.New("admin: the letter was not replayed")
	ErrNoLetter            = errors.New("admin: no such dead letter")
	ErrBadStream           = errors.New("admin: not a stream name")
	ErrBadAction           = errors.New("admin: no such action on a parked stream")
	ErrUnconfirmed         = errors.New("admin: the action was not confirmed")
	ErrNotParked           = errors.New("admin: the stream is not parked")
	ErrParkedBusy          = errors.New("admin: the parked stream is being released or was skipped")
	ErrLetterParks         = errors.New("admin: the letter parks its stream")
)

// Refusal is an action refused, and why: Reason is one of the Err values
// above, Err the store's typed error behind it when there is one
// (*leasestore.HeldError, *leasestore.HandoffError), and the other fields
// what the CLI needs to word it with its flags. Its message is the
// console's.
type Refusal struct {
	Kind         Kind
	Reason       error
	Err          error
	Subscription string
	Bucket       int   // the bucket concerned (ErrBadBucket, ErrBucketOutOfRange, ErrHeld)
	Buckets      int   // the subscription's N (ErrBucketOutOfRange)
	Position     int64 // the position asked for (ErrBadPosition, ErrPastHead)
	Head         int64 // the store's head (ErrPastHead)
	msg          string
}

func refuse(kind Kind, reason, err error, r Refusal, format string, args ...any) *Refusal {
	r.Kind, r.Reason, r.Err, r.msg = kind, reason, err, fmt.Sprintf(format, args...)
	return &r
}

// Error says what was refused and what to do, without the CLI's flags.
func (r *Refusal) Error() string { return r.msg }

// Unwrap returns the reason and the store's error behind it.
func (r *Refusal) Unwrap() []error {
	if r.Err == nil {
		return []error{r.Reason}
	}
	return []error{r.Reason, r.Err}
}
