package eventsource

import (
	"context"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// Reads page through events from a cursor: a stream version for stream
// reads, a global position (exclusive) for the others. A limit of 0 or less
// means 1000.

const defaultReadLimit = 1000

func limitOf(n int) int {
	if n <= 0 {
		return defaultReadLimit
	}
	return n
}

// ReadStream returns up to limit events of stream with version >= from, in
// version order. Events committed but not yet sequenced have Position 0.
func (s *Store) ReadStream(ctx context.Context, stream string, from int64, limit int) ([]RecordedEvent, error) {
	if _, err := ParseStreamName(stream); err != nil {
		return nil, err
	}
	return s.query(ctx, bounds{events: limitOf(limit)}, s.sql.readStreamForward, stream, from, limitOf(limit))
}

// ReadStreamBackward returns up to limit events of stream with version <=
// from, newest first; from < 0 starts at the stream's end.
func (s *Store) ReadStreamBackward(ctx context.Context, stream string, from int64, limit int) ([]RecordedEvent, error) {
	if _, err := ParseStreamName(stream); err != nil {
		return nil, err
	}
	if from < 0 {
		from = 1<<63 - 1
	}
	return s.query(ctx, bounds{events: limitOf(limit)}, s.sql.readStreamBackward, stream, from, limitOf(limit))
}

// ReadCategory returns up to limit events of category with position >
// after, in global order.
func (s *Store) ReadCategory(ctx context.Context, category string, after int64, limit int) ([]RecordedEvent, error) {
	if err := ValidateCategory(category); err != nil {
		return nil, err
	}
	return s.query(ctx, bounds{events: limitOf(limit)}, s.sql.readCategory, category, after, limitOf(limit))
}

// ReadAll returns up to limit events of the whole store ($all) with
// position > after, in global order.
func (s *Store) ReadAll(ctx context.Context, after int64, limit int) ([]RecordedEvent, error) {
	return s.ReadAllBounded(ctx, after, limit, 0)
}

// ReadAllBounded is [Store.ReadAll] bounded in bytes as well: it stops
// after the event that brings the total [RecordedEvent.Size] of the events
// it returns to maxBytes or more, so that a page of large events does not
// hold limit of them in memory at once. It returns at least one event when
// there is one; maxBytes <= 0 means no byte bound. A page is complete only
// if it holds limit events or reaches maxBytes: read on after its last
// event.
func (s *Store) ReadAllBounded(ctx context.Context, after int64, limit int, maxBytes int64) ([]RecordedEvent, error) {
	return s.query(ctx, bounds{limitOf(limit), maxBytes}, s.sql.readAll, after, limitOf(limit))
}

// ReadBucket returns up to limit events of category with position > after
// that belong to consumer-group bucket of a group of size, in global order.
// Every event of a stream belongs to one bucket. Call
// [Store.EnsureConsumerGroupIndex] for size once first, or the read scans
// the whole category.
func (s *Store) ReadBucket(ctx context.Context, category string, bucket, size int, after int64, limit int) ([]RecordedEvent, error) {
	return s.ReadBucketBounded(ctx, category, bucket, size, after, limit, 0)
}

// ReadBucketBounded is [Store.ReadBucket] bounded in bytes as well, as
// [Store.ReadAllBounded] is.
func (s *Store) ReadBucketBounded(ctx context.Context, category string, bucket, size int, after int64, limit int, maxBytes int64) ([]RecordedEvent, error) {
	if err := ValidateCategory(category); err != nil {
		return nil, err
	}
	if err := checkGroup(bucket, size); err != nil {
		return nil, err
	}
	return s.query(ctx, bounds{limitOf(limit), maxBytes}, bucketRead(s.q, size), category, bucket, after, limitOf(limit))
}

// HeadPosition returns the highest global position handed out so far.
func (s *Store) HeadPosition(ctx context.Context) (int64, error) {
	var p int64
	err := s.pool.QueryRow(ctx, s.sql.headPosition).Scan(&p)
	return p, err
}

// Categories returns up to limit of the categories that have sequenced
// events, by name, one index probe per category.
func (s *Store) Categories(ctx context.Context, limit int) ([]string, error) {
	rows, _ := s.pool.Query(ctx, s.sql.categories, limit)
	return pgx.CollectRows(rows, pgx.RowTo[string])
}

// bounds limit a read: at most events events (the result slice is sized
// for them once: events are large, and growing the slice copies them), and
// when bytes > 0, no event after the one that brings the total
// [RecordedEvent.Size] to bytes.
type bounds struct {
	events int
	bytes  int64
}

// query runs a read of at most limit events. A read that fails on one row
// (see isRowFault) is finished by isolate.
func (s *Store) query(ctx context.Context, b bounds, r readSQL, args ...any) ([]RecordedEvent, error) {
	return s.queryBounded(ctx, s.pool, b, r, args...)
}

// queryOn is query of at most limit events on db.
func (s *Store) queryOn(ctx context.Context, db querier, limit int, r readSQL, args ...any) ([]RecordedEvent, error) {
	return s.queryBounded(ctx, db, bounds{events: limit}, r, args...)
}

func (s *Store) queryBounded(ctx context.Context, db querier, b bounds, r readSQL, args ...any) ([]RecordedEvent, error) {
	events, err := scanQuery(ctx, db, b, r.full, args...)
	switch {
	case err == nil:
		return events, nil
	case isRowFault(err):
		return s.isolate(ctx, db, b, r, events, args)
	}
	return nil, err
}

// scanQuery runs sql and returns its events; on an error, those read
// before it too.
func scanQuery(ctx context.Context, db querier, b bounds, sql string, args ...any) ([]RecordedEvent, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows, b)
}

// isolate finishes a read that failed on a row: it reads the page's rows
// without their payloads, keeps those the failed read returned, and reads
// the others in order. PostgreSQL sends rows in order as it makes them, so
// the row after those returned is the suspect: it is read alone and, if
// that fails too, returned marked unreadable (see [UnreadableEventError]),
// and the rest of the page is read after it. Each unreadable row costs one
// failed read of the page and one of its own. The byte bound applies to
// the whole page, as in a read that does not fail.
func (s *Store) isolate(ctx context.Context, db querier, b bounds, r readSQL, done []RecordedEvent, args []any) ([]RecordedEvent, error) {
	keys, err := scanQuery(ctx, db, bounds{events: b.events}, r.keys, args...)
	if err != nil {
		return nil, err
	}
	out := make([]RecordedEvent, 0, len(keys))
	var used int64
	for i, e := range done {
		if i >= len(keys) || keys[i].ID != e.ID {
			break // the page changed between the reads: read the rest again
		}
		out = append(out, e)
		used += e.Size()
	}
	full := func() bool { return b.bytes > 0 && used >= b.bytes }
	for i := len(out); i < len(keys) && !full(); {
		suspect, err := scanQuery(ctx, db, bounds{events: 1}, s.sql.readEventsByID.full, []uuid.UUID{keys[i].ID})
		switch {
		case isRowFault(err):
			e := keys[i]
			e.Err = &UnreadableEventError{EventID: e.ID, Stream: e.Stream, Version: e.Version, Position: e.Position, Err: err}
			out = append(out, e)
			used += e.Size()
		case err != nil:
			return nil, err
		default:
			out = append(out, suspect...) // none if the row went meanwhile
			for _, e := range suspect {
				used += e.Size()
			}
		}
		i++
		if i == len(keys) || full() {
			break
		}
		ids := make([]uuid.UUID, 0, len(keys)-i)
		for _, k := range keys[i:] {
			ids = append(ids, k.ID)
		}
		rb := bounds{events: len(ids)}
		if b.bytes > 0 {
			rb.bytes = b.bytes - used
		}
		rest, err := scanQuery(ctx, db, rb, s.sql.readEventsByID.full, ids)
		if err != nil && !isRowFault(err) {
			return nil, err
		}
		out = append(out, rest...)
		if err == nil {
			break
		}
		for _, e := range rest {
			used += e.Size()
		}
		if n := len(rest); n > 0 {
			for keys[i].ID != rest[n-1].ID {
				i++
			}
			i++
		}
	}
	return out, nil
}

// scanEvents reads rows up to b. Rows past a byte bound are left to
// rows.Close, which reads and discards them one at a time: callers that
// meet large events ask for fewer.
func scanEvents(rows pgx.Rows, b bounds) ([]RecordedEvent, error) {
	defer rows.Close()
	out := make([]RecordedEvent, 0, min(b.events, 10_000))
	var used int64
	for (b.bytes <= 0 || used < b.bytes) && rows.Next() {
		var e RecordedEvent
		var meta []byte
		// data scans as raw bytes: into a json.RawMessage pgx would run
		// json.Unmarshal over every payload, and PostgreSQL has already
		// validated it.
		if err := rows.Scan(&e.ID, &e.Stream, &e.Category, &e.Version, &e.Position, &e.Hash,
			&e.Type, (*[]byte)(&e.Data), &meta, &e.RecordedAt); err != nil {
			return out, err
		}
		if len(meta) > 0 {
			e.Metadata = meta
		}
		out = append(out, e)
		used += e.Size()
	}
	return out, rows.Err()
}
