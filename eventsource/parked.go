package eventsource

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Parked-stream errors. Bad input (a bad name, bucket or version) wraps
// [ErrInvalidDeadLetter]; a refused fence, [ErrFenceLost].
var (
	// ErrNotParked reports that a subscription has no parked stream of
	// that name (or that the stream belongs to another bucket than the
	// one named).
	ErrNotParked = errors.New("kumi: stream not parked")
	// ErrParkConflict reports a change the parked stream's state forbids:
	// an operator's request on a stream already being released or
	// skipped, a release step on a stream no operator released, or
	// parking a stream parked already.
	ErrParkConflict = errors.New("kumi: parked stream in another state")
)

// ParkAction is what an operator does with a parked stream (see
// docs/design/parking.md).
type ParkAction string

const (
	// ParkReplay releases the stream: its reader delivers the dead letter's
	// event, then the stream's events after it, in order, then the stream
	// flows again; the letter is marked replayed.
	ParkReplay ParkAction = "replay"
	// ParkDiscard deletes the dead letter and releases the stream: its
	// reader delivers the stream's events after the letter's, in order.
	ParkDiscard ParkAction = "discard"
	// ParkSkip passes over the stream for good: its reader delivers none
	// of its events again, the letter stays. It cannot be undone.
	ParkSkip ParkAction = "skip"
)

// ParkedStream is a stream a subscription parked when it dead-lettered one
// of its events: the stream's later events wait, in the store, until an
// operator releases it. It costs one row, never a copy of its events.
type ParkedStream struct {
	Subscription string
	Stream       string
	// Hash is the stream's consumer-group hash: its bucket in a
	// generation of n buckets is [BucketOfHash](Hash, n). The row has no
	// bucket of its own, so a resize moves nothing (the dead letter says
	// which generation and bucket parked it).
	Hash int64
	// EventID, Position and Version are the dead-lettered event that
	// parked it, Reason the letter's reason then.
	EventID  uuid.UUID
	Position int64
	Version  int64
	Reason   string
	// ParkedAt is when the stream was parked (a stream parked again during
	// its release keeps it).
	ParkedAt time.Time
	// Action is what an operator asked for: "" while parked; ParkReplay
	// or ParkDiscard while its reader releases it; ParkSkip for good.
	// RequestedAt is when (nil while parked).
	Action      ParkAction
	RequestedAt *time.Time
	// DoneVersion: the stream's events up to this version are done for
	// the subscription; a release delivers from DoneVersion+1
	// ([Store.ReadStream]). It is Version while parked, Version−1 once a
	// replay is asked for (the letter's event is due again).
	DoneVersion int64
	// Waiting is how many of the stream's events come after DoneVersion:
	// read from the stream's row (its last version), not counted.
	Waiting int64
}

// ParkedFilter selects parked streams of a subscription.
type ParkedFilter struct {
	// Buckets and Bucket, when Buckets > 0, select the streams of bucket
	// Bucket of a generation of Buckets buckets (by their hash).
	Buckets, Bucket int
	// Stream, when not "", selects that stream alone.
	Stream string
	// Requested selects only the streams an operator asked to replay or
	// discard: the releases due (a reader looks for them on each lease
	// pass).
	Requested bool
	// After is the cursor: streams named after it (the last one's name).
	After string
	// Limit is the page size (0 means 1000).
	Limit int
}

// ParkedRelease is a step of a reader releasing a parked stream its bucket
// holds (see [Store.ReleaseParked]).
type ParkedRelease struct {
	Subscription, Stream string
	// Buckets and Bucket are the reader's: bucket Bucket of a generation
	// of Buckets buckets. A stream of another bucket is not touched.
	Buckets, Bucket int
	// Through moves DoneVersion forward to it: the stream's events up to
	// that version are delivered (below DoneVersion, it changes nothing).
	Through int64
	// Done ends the release: the row goes, and the stream's events after
	// DoneVersion flow as any other. Refused before the letter's event is
	// done.
	Done bool
	// Fence is the reader's lease; nil writes unfenced.
	Fence Fence
}

// ParkStream records a dead letter and parks its stream, in one
// transaction in which fence (the reader's lease) is checked first: the
// stream's later events are not delivered until an operator releases it,
// while the bucket's checkpoint moves over them. d is as for
// [Store.AddDeadLetter]. Parking a stream parked already is refused
// ([ErrParkConflict]) unless it is being released and d's event comes after
// what the release has done (the stream is parked again at d, keeping its
// ParkedAt), or d is the letter that parked it (a retried write). A nil
// fence writes unfenced.
func (s *Store) ParkStream(ctx context.Context, d DeadLetter, fence Fence) (ParkedStream, error) {
	var p ParkedStream
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if fence != nil {
			if err := fence.Check(ctx, tx); err != nil {
				return err
			}
		}
		var err error
		if d, err = s.addDeadLetter(ctx, tx, d); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, s.sql.parkAdd, d.Subscription, d.EventID, d.Position, d.Reason)
		if err != nil {
			return fmt.Errorf("kumi: park stream: %w", err)
		}
		p, err = pgx.CollectExactlyOneRow(rows, scanParked)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.parkRefusal(ctx, tx, d.Subscription, d.Stream, nil, "park it again at position %d", d.Position)
		}
		return err
	})
	return p, err
}

// ParkedStreams lists a subscription's parked streams, by stream name,
// paged by filter.After and filter.Limit.
func (s *Store) ParkedStreams(ctx context.Context, subscription string, filter ParkedFilter) ([]ParkedStream, error) {
	if err := ValidateSubscription(subscription); err != nil {
		return nil, err
	}
	if err := checkParkedBucket(filter.Buckets, filter.Bucket); err != nil {
		return nil, err
	}
	rows, err := s.pool.Query(ctx, s.sql.parkList, subscription, filter.Buckets, filter.Bucket, filter.Stream,
		filter.After, limitOf(filter.Limit), filter.Requested)
	if err != nil {
		return nil, fmt.Errorf("kumi: list parked streams: %w", err)
	}
	return pgx.CollectRows(rows, scanParked)
}

// RequestRelease records an operator's action on a parked stream: with
// ParkReplay or ParkDiscard, the stream's reader releases it (see
// [Store.ReleaseParked]); ParkDiscard deletes the dead letter in the same
// transaction; ParkSkip passes over the stream for good. Only a parked
// stream takes a request: one being released or skipped is refused with
// [ErrParkConflict], one not parked with [ErrNotParked]. A request needs no
// lease: it changes nothing a reader has in hand (the reader skips the
// stream's events until it sees the request, and carries out the release
// under its own lease). It returns the row as changed.
func (s *Store) RequestRelease(ctx context.Context, subscription, stream string, action ParkAction) (ParkedStream, error) {
	if err := checkParkedStream(subscription, stream); err != nil {
		return ParkedStream{}, err
	}
	switch action {
	case ParkReplay, ParkDiscard, ParkSkip:
	default:
		return ParkedStream{}, fmt.Errorf("%w: parked stream action %q: say %q, %q or %q", ErrInvalidDeadLetter, action,
			ParkReplay, ParkDiscard, ParkSkip)
	}
	var p ParkedStream
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, s.sql.parkRequest, subscription, stream, string(action))
		if err != nil {
			return fmt.Errorf("kumi: request release: %w", err)
		}
		p, err = pgx.CollectExactlyOneRow(rows, scanParked)
		if errors.Is(err, pgx.ErrNoRows) {
			return s.parkRefusal(ctx, tx, subscription, stream, nil, "%s it", action)
		}
		if err != nil || action != ParkDiscard {
			return err
		}
		_, err = tx.Exec(ctx, s.sql.parkDiscardLetter, subscription, p.EventID)
		return err
	})
	return p, err
}

// ReleaseParked is a reader's step in releasing a parked stream of its
// bucket, on a stream an operator asked to replay or discard ([ErrNotParked]
// when there is none in r's bucket, [ErrParkConflict] when not released):
// fenced by r.Fence, it moves the row's DoneVersion to r.Through and, with
// r.Done, drops the row. A replay's letter is marked replayed once
// DoneVersion reaches its event. It returns the row as written; a step
// whose Through is at or below DoneVersion changes nothing and returns the
// row as it is, locked until tx ends — the check a commit with the
// handler's writes makes first (as [Store.LockCheckpointTx] for a
// checkpoint). tx is the caller's transaction (the handler's writes commit
// with the step: exactly-once), or nil for one of its own.
func (s *Store) ReleaseParked(ctx context.Context, tx pgx.Tx, r ParkedRelease) (ParkedStream, error) {
	if err := checkParkedStream(r.Subscription, r.Stream); err != nil {
		return ParkedStream{}, err
	}
	if err := checkParkedBucket(r.Buckets, r.Bucket); err != nil {
		return ParkedStream{}, err
	}
	if r.Buckets == 0 || r.Through < 0 {
		return ParkedStream{}, fmt.Errorf("%w: release of %q: buckets %d, through version %d (buckets > 0, version >= 0)",
			ErrInvalidDeadLetter, r.Stream, r.Buckets, r.Through)
	}
	var p ParkedStream
	step := func(tx pgx.Tx) error {
		if r.Fence != nil {
			if err := r.Fence.Check(ctx, tx); err != nil {
				return err
			}
		}
		rows, err := tx.Query(ctx, s.sql.parkRelease, r.Subscription, r.Stream, r.Buckets, r.Bucket, r.Through, r.Done)
		if err != nil {
			return fmt.Errorf("kumi: release parked stream: %w", err)
		}
		p, err = pgx.CollectExactlyOneRow(rows, scanParked)
		if !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return s.parkRefusal(ctx, tx, r.Subscription, r.Stream, &r, "release it through version %d", r.Through)
	}
	if tx != nil {
		return p, step(tx)
	}
	return p, pgx.BeginFunc(ctx, s.pool, step)
}

// parkRefusal says why a change of (subscription, stream)'s row found
// none to change: not parked (or, for a release step r, parked in another
// bucket than r's), or in another state.
func (s *Store) parkRefusal(ctx context.Context, tx pgx.Tx, subscription, stream string, r *ParkedRelease,
	format string, args ...any) error {
	what := fmt.Sprintf(format, args...)
	rows, err := tx.Query(ctx, s.sql.parkState, subscription, stream)
	if err != nil {
		return fmt.Errorf("kumi: read parked stream: %w", err)
	}
	p, err := pgx.CollectExactlyOneRow(rows, scanParked)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q has no parked stream %q (cannot %s)", ErrNotParked, subscription, stream, what)
	case err != nil:
		return fmt.Errorf("kumi: read parked stream: %w", err)
	case r != nil && BucketOfHash(p.Hash, r.Buckets) != r.Bucket:
		return fmt.Errorf("%w: stream %q of %q belongs to bucket %d of %d, not %d (cannot %s)", ErrNotParked,
			stream, subscription, BucketOfHash(p.Hash, r.Buckets), r.Buckets, r.Bucket, what)
	}
	state := "parked, no release asked"
	switch {
	case p.Action == ParkSkip:
		state = "skipped for good"
	case p.Action != "":
		state = fmt.Sprintf("being released (%s), done through version %d of the letter's %d", p.Action, p.DoneVersion, p.Version)
	}
	return fmt.Errorf("%w: stream %q of %q is %s (cannot %s)", ErrParkConflict, stream, subscription, state, what)
}

func checkParkedStream(subscription, stream string) error {
	if err := ValidateSubscription(subscription); err != nil {
		return err
	}
	_, err := ParseStreamName(stream)
	return err
}

func checkParkedBucket(buckets, bucket int) error {
	if buckets < 0 || buckets > MaxGroupSize || bucket < 0 || (buckets > 0 && bucket >= buckets) || (buckets == 0 && bucket != 0) {
		return fmt.Errorf("%w: bucket %d of %d: buckets are 0 to n-1 of n, 1 <= n <= %d", ErrInvalidDeadLetter,
			bucket, buckets, MaxGroupSize)
	}
	return nil
}

func scanParked(row pgx.CollectableRow) (ParkedStream, error) {
	var p ParkedStream
	var action string
	err := row.Scan(&p.Subscription, &p.Stream, &p.Hash, &p.EventID, &p.Position, &p.Version,
		&p.DoneVersion, &p.Reason, &p.ParkedAt, &action, &p.RequestedAt, &p.Waiting)
	p.Action = ParkAction(action)
	return p, err
}
