package admin

import (
	"context"
	"errors"
	"strings"

	"github.com/kumi-run/kumi/eventsource"
)

// Park asks for an action on a parked stream (docs/design/parking.md).
type Park struct {
	Subscription, Stream string
	// Action is eventsource.ParkReplay (its reader delivers the letter's
	// event, then the stream's events after it), ParkDiscard (the letter
	// is deleted, the events after it delivered) or ParkSkip (the stream
	// is passed over for good).
	Action eventsource.ParkAction
	// Confirm must repeat Stream for ParkSkip, which cannot be undone.
	Confirm string
}

// ParkedStream carries out p through eventsource.Store.RequestRelease and
// returns the stream's row as changed. It refuses (*Refusal) a bad stream
// name or action, a skip whose Confirm does not repeat the stream
// (ErrUnconfirmed), an unknown subscription, a stream the subscription has
// not parked (ErrNotParked) and one already being released or skipped
// (ErrParkedBusy), before it changes anything. It needs no lease: the
// bucket's reader carries the release out under its own.
func ParkedStream(ctx context.Context, store *eventsource.Store, p Park) (eventsource.ParkedStream, error) {
	sub := p.Subscription
	if _, err := eventsource.ParseStreamName(p.Stream); err != nil {
		return eventsource.ParkedStream{}, refuse(BadInput, ErrBadStream, err, Refusal{Subscription: sub}, "%v", err)
	}
	switch p.Action {
	case eventsource.ParkReplay, eventsource.ParkDiscard:
	case eventsource.ParkSkip:
		if p.Confirm != p.Stream {
			return eventsource.ParkedStream{}, refuse(BadInput, ErrUnconfirmed, nil, Refusal{Subscription: sub},
				"skipping stream %q passes over its events for good: confirm it by repeating the stream's name", p.Stream)
		}
	default:
		return eventsource.ParkedStream{}, refuse(BadInput, ErrBadAction, nil, Refusal{Subscription: sub},
			"action %q: say replay, discard or skip", p.Action)
	}
	if _, err := knownBuckets(ctx, store, sub); err != nil {
		return eventsource.ParkedStream{}, err
	}
	ps, err := store.RequestRelease(ctx, sub, p.Stream, p.Action)
	switch {
	case errors.Is(err, eventsource.ErrNotParked):
		return ps, refuse(NotFound, ErrNotParked, err, Refusal{Subscription: sub},
			"subscription %q has not parked stream %q (released meanwhile?)", sub, p.Stream)
	case errors.Is(err, eventsource.ErrParkConflict):
		return ps, refuse(Conflict, ErrParkedBusy, err, Refusal{Subscription: sub}, "%s",
			strings.TrimPrefix(err.Error(), eventsource.ErrParkConflict.Error()+": "))
	}
	return ps, err
}
