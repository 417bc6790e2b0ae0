package admin

import (
	"context"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/kumi-run/kumi/eventsource"
)

// Letter reads sub's pending dead letter of event id, for a replay: a
// missing one is eventsource.ErrDeadLetterNotFound, and one replayed
// already is refused (*Refusal, Reason ErrAlreadyReplayed) unless again.
func Letter(ctx context.Context, store *eventsource.Store, sub string, id uuid.UUID, again bool) (eventsource.DeadLetter, error) {
	d, err := store.DeadLetter(ctx, sub, id)
	if err != nil {
		return d, err
	}
	if d.ReplayedAt != nil && !again {
		return d, refuse(Conflict, ErrAlreadyReplayed, nil, Refusal{Subscription: sub, Bucket: d.Bucket},
			"event %s was already replayed at %s", d.EventID, d.ReplayedAt.UTC().Format(time.RFC3339))
	}
	return d, nil
}

// Replay hands the letter d (as Letter read it) to handle through
// eventsource.Store.ReplayDeadLetter: the letter is claimed for the
// handler's duration and marked replayed when it succeeds; checkpoints
// never move. again replays a letter replayed already. The handler's
// error is returned as it is (the letter stays pending, its attempts
// counted); a letter another replay holds, or that was discarded or
// replayed meanwhile, is refused (*Refusal, Reason ErrNotReplayed) and no
// other letter is touched; so is a letter that parks its stream (Reason
// ErrLetterParks): the stream's release replays it.
func Replay(ctx context.Context, store *eventsource.Store, d eventsource.DeadLetter, again bool, handle eventsource.ReplayHandler) error {
	ok, err := store.ReplayDeadLetter(ctx, d, again, handle)
	switch {
	case errors.Is(err, eventsource.ErrParkConflict):
		return refuse(Conflict, ErrLetterParks, err, Refusal{Subscription: d.Subscription, Bucket: d.Bucket},
			"the dead letter of event %s parks stream %q: replay the stream instead (kumi parked replay), "+
				"which replays the letter in order with the events that wait behind it", d.EventID, d.Stream)
	case err != nil:
		return err
	case !ok:
		return refuse(Conflict, ErrNotReplayed, nil, Refusal{Subscription: d.Subscription, Bucket: d.Bucket},
			"event %s was not replayed: another replay holds it, or it was replayed meanwhile", d.EventID)
	}
	return nil
}

// Discard deletes sub's dead letter of event id (its event stays in the
// store); a missing one is refused (*Refusal, Reason ErrNoLetter).
func Discard(ctx context.Context, store *eventsource.Store, sub string, id uuid.UUID) error {
	ok, err := store.DeleteDeadLetter(ctx, sub, id)
	if err != nil {
		return err
	}
	if !ok {
		return refuse(NotFound, ErrNoLetter, nil, Refusal{Subscription: sub},
			"%q has no dead letter for event %s (discarded meanwhile?)", sub, id)
	}
	return nil
}
