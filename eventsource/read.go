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
	return s.query(ctx, limitOf(limit), s.sql.readStreamForward, stream, from, limitOf(limit))
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
	return s.query(ctx, limitOf(limit), s.sql.readStreamBackward, stream, from, limitOf(limit))
}

// ReadCategory returns up to limit events of category with position >
// after, in global order.
func (s *Store) ReadCategory(ctx context.Context, category string, after int64, limit int) ([]RecordedEvent, error) {
	if err := ValidateCategory(category); err != nil {
		return nil, err
	}
	return s.query(ctx, limitOf(limit), s.sql.readCategory, category, after, limitOf(limit))
}

// ReadAll returns up to limit events of the whole store ($all) with
// position > after, in global order.
func (s *Store) ReadAll(ctx context.Context, after int64, limit int) ([]RecordedEvent, error) {
	return s.query(ctx, limitOf(limit), s.sql.readAll, after, limitOf(limit))
}

// ReadMember returns up to limit events of category with position > after
// that belong to consumer-group member of a group of size, in global order.
// Every event of a stream belongs to one member. Call
// [Store.EnsureConsumerGroupIndex] for size once first, or the read scans
// the whole category.
func (s *Store) ReadMember(ctx context.Context, category string, member, size int, after int64, limit int) ([]RecordedEvent, error) {
	if err := ValidateCategory(category); err != nil {
		return nil, err
	}
	if err := checkGroup(member, size); err != nil {
		return nil, err
	}
	return s.query(ctx, limitOf(limit), memberRead(s.q, size), category, member, after, limitOf(limit))
}

// HeadPosition returns the highest global position handed out so far.
func (s *Store) HeadPosition(ctx context.Context) (int64, error) {
	var p int64
	err := s.pool.QueryRow(ctx, s.sql.headPosition).Scan(&p)
	return p, err
}

// query runs a read of at most limit events (the slice is sized for it
// once: events are large, and growing the slice copies them). A read that
// fails on one row (see isRowFault) is finished by isolate.
func (s *Store) query(ctx context.Context, limit int, r readSQL, args ...any) ([]RecordedEvent, error) {
	return s.queryOn(ctx, s.pool, limit, r, args...)
}

// queryOn is query on db.
func (s *Store) queryOn(ctx context.Context, db querier, limit int, r readSQL, args ...any) ([]RecordedEvent, error) {
	events, err := scanQuery(ctx, db, limit, r.full, args...)
	switch {
	case err == nil:
		return events, nil
	case isRowFault(err):
		return s.isolate(ctx, db, limit, r, events, args)
	}
	return nil, err
}

// scanQuery runs sql and returns its events; on an error, those read
// before it too.
func scanQuery(ctx context.Context, db querier, limit int, sql string, args ...any) ([]RecordedEvent, error) {
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows, limit)
}

// isolate finishes a read that failed on a row: it reads the page's rows
// without their payloads, keeps those the failed read returned, and reads
// the others in order. PostgreSQL sends rows in order as it makes them, so
// the row after those returned is the suspect: it is read alone and, if
// that fails too, returned marked unreadable (see [UnreadableEventError]),
// and the rest of the page is read after it. Each unreadable row costs one
// failed read of the page and one of its own.
func (s *Store) isolate(ctx context.Context, db querier, limit int, r readSQL, done []RecordedEvent, args []any) ([]RecordedEvent, error) {
	keys, err := scanQuery(ctx, db, limit, r.keys, args...)
	if err != nil {
		return nil, err
	}
	out := make([]RecordedEvent, 0, len(keys))
	for i, e := range done {
		if i >= len(keys) || keys[i].ID != e.ID {
			break // the page changed between the reads: read the rest again
		}
		out = append(out, e)
	}
	for i := len(out); i < len(keys); {
		suspect, err := scanQuery(ctx, db, 1, s.sql.readEventsByID.full, []uuid.UUID{keys[i].ID})
		switch {
		case isRowFault(err):
			e := keys[i]
			e.Err = &UnreadableEventError{EventID: e.ID, Stream: e.Stream, Version: e.Version, Position: e.Position, Err: err}
			out = append(out, e)
		case err != nil:
			return nil, err
		default:
			out = append(out, suspect...) // none if the row went meanwhile
		}
		i++
		if i == len(keys) {
			break
		}
		ids := make([]uuid.UUID, 0, len(keys)-i)
		for _, k := range keys[i:] {
			ids = append(ids, k.ID)
		}
		rest, err := scanQuery(ctx, db, len(ids), s.sql.readEventsByID.full, ids)
		if err != nil && !isRowFault(err) {
			return nil, err
		}
		out = append(out, rest...)
		if err == nil {
			break
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

func scanEvents(rows pgx.Rows, limit int) ([]RecordedEvent, error) {
	defer rows.Close()
	out := make([]RecordedEvent, 0, min(limit, 10_000))
	for rows.Next() {
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
	}
	return out, rows.Err()
}
