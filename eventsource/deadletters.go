package eventsource

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/kumi-run/kumi/internal/migrate"
	"github.com/kumi-run/kumi/kumierr"
)

// maxGeneration is the last generation of a subscription's buckets: a
// checkpoint's slot, generation × MaxGroupSize + bucket, fits PostgreSQL's
// integer (see docs/design/resize.md).
const maxGeneration = math.MaxInt32 / MaxGroupSize

// MaxDeadLetterReasonLength bounds a dead letter's reason, in bytes; a
// longer reason is truncated.
const MaxDeadLetterReasonLength = 8 << 10

// Dead-letter errors.
var (
	// ErrDeadLetterNotFound reports that a subscription has no dead letter
	// for an event.
	ErrDeadLetterNotFound = errors.New("kumi: dead letter not found")
	// ErrEventNotFound reports that a dead letter names an event the store
	// does not have (or has not sequenced yet, or whose position or stream
	// differ from the ones given).
	ErrEventNotFound = errors.New("kumi: event not found")
	// ErrInvalidDeadLetter reports a dead letter with an invalid field.
	ErrInvalidDeadLetter = errors.New("kumi: invalid dead letter")
)

// DeadLetter is an event a subscription gave up on: its handler failed
// Attempts times (or asked for it to be dead-lettered) for Reason. There is
// at most one per (subscription, event).
type DeadLetter struct {
	// Subscription and Bucket are the subscription and consumer-group
	// bucket that gave up on the event; Generation is the generation of
	// the subscription's buckets Bucket belongs to (0 until the
	// subscription is first resized, see docs/design/resize.md). A bucket number
	// means another set of streams in another generation.
	Subscription string
	Generation   int
	Bucket       int
	// EventID is the event's id.
	EventID uuid.UUID
	// Position and Stream are the event's. When adding a dead letter they
	// may be left zero: the store fills them in from the event (and checks
	// them against it when given).
	Position int64
	Stream   string
	// Reason is free text, usually the handler's last error. It is stored
	// as valid UTF-8 without NUL bytes, at most MaxDeadLetterReasonLength
	// bytes.
	Reason string
	// Attempts is how many times the handler was tried.
	Attempts int
	// History holds the reasons Reason replaced, oldest first: a failed
	// replay's error replaces the reason, and so does the event's
	// dead-lettering again. The first reason the event was given up for
	// is History[0] once there is one; the store keeps it and the latest
	// 19. Set by the store; ignored when adding a letter.
	History []DeadLetterReason
	// CreatedAt is set by the store when the letter is added.
	CreatedAt time.Time
	// ReplayedAt is set by a successful [Store.ReplayDeadLetters]; nil
	// until then.
	ReplayedAt *time.Time
}

// DeadLetterReason is a reason a dead letter had before its present one.
type DeadLetterReason struct {
	Reason     string    `json:"reason"`
	Attempts   int       `json:"attempts"`    // the letter's attempts then
	ReplacedAt time.Time `json:"replaced_at"` // when a newer reason replaced it
}

// DeadLetterFilter selects dead letters of a subscription.
type DeadLetterFilter struct {
	// Generation, when not nil, selects one generation's letters (see
	// [DeadLetter.Generation]); nil selects every generation's.
	Generation *int
	// Bucket, when not nil, selects one bucket's letters: of Generation
	// when that is given, else of every generation (a caller that means
	// the serving generation's bucket gives its generation too).
	Bucket *int
	// After selects letters of events with a position above it: the cursor
	// for paging (the last letter's Position).
	After int64
	// Limit is the page size of [Store.DeadLetters] (0 means 1000), and the
	// most letters [Store.ReplayDeadLetters] replays (0 means all).
	Limit int
	// IncludeReplayed selects letters already replayed too; by default only
	// pending ones are selected.
	IncludeReplayed bool
}

// AddDeadLetter records a dead letter, or replaces the subscription's
// letter for the same event (which makes it pending again). The event must
// exist and be sequenced, or the error wraps [ErrEventNotFound]. It returns
// the letter as stored.
func (s *Store) AddDeadLetter(ctx context.Context, d DeadLetter) (DeadLetter, error) {
	return s.addDeadLetter(ctx, s.pool, d)
}

// AddDeadLetterTx is [Store.AddDeadLetter] inside the caller's
// transaction: a worker dead-letters an event and moves its fenced
// checkpoint past it in one commit.
func (s *Store) AddDeadLetterTx(ctx context.Context, tx pgx.Tx, d DeadLetter) (DeadLetter, error) {
	return s.addDeadLetter(ctx, tx, d)
}

func (s *Store) addDeadLetter(ctx context.Context, db queryRower, d DeadLetter) (DeadLetter, error) {
	if err := ValidateSubscription(d.Subscription); err != nil {
		return DeadLetter{}, err
	}
	switch {
	case d.Bucket < 0:
		return DeadLetter{}, fmt.Errorf("%w: negative bucket %d", ErrInvalidDeadLetter, d.Bucket)
	case d.Generation < 0 || d.Generation > maxGeneration:
		return DeadLetter{}, fmt.Errorf("%w: generation %d: generations are 0 to %d", ErrInvalidDeadLetter, d.Generation, maxGeneration)
	case d.EventID == uuid.Nil:
		return DeadLetter{}, fmt.Errorf("%w: no event id", ErrInvalidDeadLetter)
	case d.Position < 0:
		return DeadLetter{}, fmt.Errorf("%w: negative position %d", ErrInvalidDeadLetter, d.Position)
	case d.Attempts < 0:
		return DeadLetter{}, fmt.Errorf("%w: negative attempts %d", ErrInvalidDeadLetter, d.Attempts)
	}
	if d.Stream != "" {
		if _, err := ParseStreamName(d.Stream); err != nil {
			return DeadLetter{}, err
		}
	}
	d.Reason = cleanReason(d.Reason)
	d.ReplayedAt = nil
	err := db.QueryRow(ctx, s.sql.deadLetterAdd, d.Subscription, d.Bucket, d.EventID, d.Position, d.Stream,
		d.Reason, d.Attempts, d.Generation).Scan(&d.Position, &d.Stream, &d.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("%w: dead letter for event %s (position %d, stream %q) of %q",
			ErrEventNotFound, d.EventID, d.Position, d.Stream, d.Subscription)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("kumi: add dead letter: %w", err)
	}
	return d, nil
}

// cleanReason makes free text storable: valid UTF-8, no NUL, bounded.
func cleanReason(r string) string {
	r = strings.ToValidUTF8(r, "\uFFFD")
	r = strings.ReplaceAll(r, "\x00", "")
	if len(r) > MaxDeadLetterReasonLength {
		r = r[:MaxDeadLetterReasonLength]
		for !utf8.ValidString(r) {
			r = r[:len(r)-1]
		}
	}
	return r
}

// DeadLetters lists a subscription's dead letters in position order,
// paged by filter.After and filter.Limit.
func (s *Store) DeadLetters(ctx context.Context, subscription string, filter DeadLetterFilter) ([]DeadLetter, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return nil, err
	}
	if b := filter.Bucket; b != nil && (*b < 0 || *b > math.MaxInt32) {
		return nil, fmt.Errorf("%w: filter bucket %d: buckets are 0 to %d", ErrInvalidDeadLetter, *b, math.MaxInt32)
	}
	if g := filter.Generation; g != nil && (*g < 0 || *g > maxGeneration) {
		return nil, fmt.Errorf("%w: filter generation %d: generations are 0 to %d", ErrInvalidDeadLetter, *g, maxGeneration)
	}
	rows, err := s.pool.Query(ctx, s.sql.deadLetterList, subscription, filter.Bucket, filter.After,
		limitOf(filter.Limit), filter.IncludeReplayed, filter.Generation)
	if err != nil {
		return nil, fmt.Errorf("kumi: list dead letters: %w", err)
	}
	return pgx.CollectRows(rows, scanDeadLetter)
}

// DeadLetter returns a subscription's dead letter for an event, or an error
// wrapping [ErrDeadLetterNotFound].
func (s *Store) DeadLetter(ctx context.Context, subscription string, eventID uuid.UUID) (DeadLetter, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return DeadLetter{}, err
	}
	rows, err := s.pool.Query(ctx, s.sql.deadLetterGet, subscription, eventID)
	if err != nil {
		return DeadLetter{}, fmt.Errorf("kumi: read dead letter: %w", err)
	}
	d, err := pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	if errors.Is(err, pgx.ErrNoRows) {
		return DeadLetter{}, fmt.Errorf("%w: %q has none for event %s", ErrDeadLetterNotFound, subscription, eventID)
	}
	return d, err
}

// DeleteDeadLetter removes a subscription's dead letter for an event (an
// operator's "discard"); it reports whether there was one.
func (s *Store) DeleteDeadLetter(ctx context.Context, subscription string, eventID uuid.UUID) (bool, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, s.sql.deadLetterDelete, subscription, eventID)
	if err != nil {
		return false, fmt.Errorf("kumi: delete dead letter: %w", err)
	}
	return tag.RowsAffected() > 0, nil
}

// ReplayHandler handles a replayed event. The context carries the event's
// trace context (see [TraceContext]).
type ReplayHandler func(ctx context.Context, event RecordedEvent) error

// ReplayDeadLetters hands the events of a subscription's dead letters
// selected by filter to handler, one at a time in position order, and
// marks each letter replayed when handler returns nil. It returns how many
// it replayed.
//
// A letter that parks its stream (see [Store.ParkStream]) is refused
// with [ErrParkConflict], without calling handler: the stream's release
// replays it, in order with the events that wait behind it.
//
// It stops at the first handler error: that letter stays pending, its
// attempts go up by one and its reason becomes the error (the reason it
// replaces kept in [DeadLetter.History]), and the error is
// returned. A letter whose event the store cannot give back fails the same
// way, with an [*UnreadableEventError], without calling handler. Replay
// never touches the subscription's checkpoints: the live subscription goes
// on from where it is.
//
// No row lock is held while handler runs (it may be slow, or a command):
// each letter is claimed with a session advisory lock of its own, on a
// connection held for the duration of its handler, so two replays running
// at once never hand the same letter to two handlers, while a live reader
// dead-letters the event again, or an operator lists or discards letters,
// without waiting. The outcome is recorded in one statement afterwards,
// only if the letter is still the one replayed: if the event was
// dead-lettered again meanwhile, that newer letter stays pending. If the
// process dies (or its connection drops) while handler runs, the lock goes
// with the session and the letter is still pending: replay is
// at-least-once.
func (s *Store) ReplayDeadLetters(ctx context.Context, subscription string, filter DeadLetterFilter, handler ReplayHandler) (int, error) {
	if handler == nil {
		return 0, &kumierr.ConfigError{Field: "eventsource handler", Reason: "is nil"}
	}
	budget := filter.Limit
	replayed := 0
	for {
		page := filter
		page.Limit = defaultReadLimit
		if budget > 0 {
			page.Limit = min(page.Limit, budget-replayed)
		}
		letters, err := s.DeadLetters(ctx, subscription, page)
		if err != nil {
			return replayed, err
		}
		for _, d := range letters {
			ok, err := s.replayOne(ctx, d, filter.IncludeReplayed, handler)
			if err != nil {
				return replayed, err
			}
			if ok {
				replayed++
			}
		}
		if len(letters) < page.Limit || (budget > 0 && replayed >= budget) {
			return replayed, nil
		}
		filter.After = letters[len(letters)-1].Position
	}
}

// ReplayDeadLetter replays one letter — d, as [Store.DeadLetter] read it —
// with [Store.ReplayDeadLetters]'s claim and outcome, and no other: it
// reports false, without calling handler, when another replay holds the
// letter, or it was discarded or (unless includeReplayed) replayed since d
// was read. A letter that parks its stream is refused with
// [ErrParkConflict].
func (s *Store) ReplayDeadLetter(ctx context.Context, d DeadLetter, includeReplayed bool, handler ReplayHandler) (bool, error) {
	if handler == nil {
		return false, &kumierr.ConfigError{Field: "eventsource handler", Reason: "is nil"}
	}
	return s.replayOne(ctx, d, includeReplayed, handler)
}

// replayLockKey is the session advisory lock that claims a letter for a
// replay. (A collision with another key only makes a replay skip a letter
// as if another replay held it.)
func (s *Store) replayLockKey(subscription string, eventID uuid.UUID) int64 {
	return migrate.LockKey(s.cfg.Schema + ".replay." + subscription + "." + eventID.String())
}

// replayOne replays one letter; it reports false when another replay holds
// it or it is no longer pending.
func (s *Store) replayOne(ctx context.Context, d DeadLetter, includeReplayed bool, handler ReplayHandler) (bool, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, fmt.Errorf("kumi: claim dead letter: %w", err)
	}
	defer conn.Release()
	key := s.replayLockKey(d.Subscription, d.EventID)
	var got bool
	if err := conn.QueryRow(ctx, advisoryTryLock, key).Scan(&got); err != nil {
		return false, fmt.Errorf("kumi: claim dead letter: %w", err)
	}
	if !got {
		return false, nil
	}
	defer unlockSession(conn, key)
	// Read under the claim: another replay may have finished it since it
	// was listed.
	rows, err := conn.Query(ctx, s.sql.deadLetterGet, d.Subscription, d.EventID)
	if err != nil {
		return false, fmt.Errorf("kumi: claim dead letter: %w", err)
	}
	d, err = pgx.CollectExactlyOneRow(rows, scanDeadLetter)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil // discarded meanwhile
	case err != nil:
		return false, fmt.Errorf("kumi: claim dead letter: %w", err)
	case d.ReplayedAt != nil && !includeReplayed:
		return false, nil
	}
	var parks bool
	if err := conn.QueryRow(ctx, s.sql.parkHeldBy, d.Subscription, d.EventID).Scan(&parks); err != nil {
		return false, fmt.Errorf("kumi: claim dead letter: %w", err)
	}
	if parks {
		return false, fmt.Errorf("%w: the dead letter of event %s parks stream %q of %q: its release replays it, "+
			"in order with the events that wait behind it (Store.RequestRelease, kumi parked replay)",
			ErrParkConflict, d.EventID, d.Stream, d.Subscription)
	}
	events, err := s.queryOn(ctx, conn, 1, s.sql.readEventsByID, []uuid.UUID{d.EventID})
	if err != nil {
		return false, fmt.Errorf("kumi: read dead-lettered event: %w", err)
	}
	if len(events) == 0 {
		return false, fmt.Errorf("%w: dead letter of %q names event %s", ErrEventNotFound, d.Subscription, d.EventID)
	}
	ev := events[0]
	herr := ev.Err // an event the store cannot give back: no handler can take it
	if herr == nil {
		herr = handler(TraceContext(ctx, ev.Metadata), ev)
	}
	if herr != nil {
		if _, err := conn.Exec(ctx, s.sql.deadLetterFailed, d.Subscription, d.EventID, d.CreatedAt,
			cleanReason("replay: "+herr.Error())); err != nil {
			return false, errors.Join(herr, err)
		}
		return false, fmt.Errorf("kumi: replay of event %s (position %d) for %q: %w", ev.ID, ev.Position, d.Subscription, herr)
	}
	if _, err := conn.Exec(ctx, s.sql.deadLetterMark, d.Subscription, d.EventID, d.CreatedAt); err != nil {
		return false, fmt.Errorf("kumi: mark dead letter replayed: %w", err)
	}
	return true, nil
}

func scanDeadLetter(row pgx.CollectableRow) (DeadLetter, error) {
	var d DeadLetter
	err := row.Scan(&d.Subscription, &d.Generation, &d.Bucket, &d.EventID, &d.Position, &d.Stream, &d.Reason, &d.Attempts,
		&d.CreatedAt, &d.ReplayedAt, &d.History)
	return d, err
}
