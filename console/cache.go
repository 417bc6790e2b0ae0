package console

import (
	"context"
	"errors"
	"sync"
	"time"
)

// lookEvery is how old a look at a subscription may be when it is served:
// however many pages watch a subscription, the console reads it at most
// once in that time.
const lookEvery = time.Second

// lookTimeout bounds one read. A read is shared by every request waiting
// for it, so it does not run on any one request's context.
const lookTimeout = 10 * time.Second

// looks shares the reads of subscriptions (or of the overview, T a list
// of summaries under the key "") between concurrent viewers: a request
// gets the last look at its key when it is younger than lookEvery, waits
// for the read in flight if there is one, and reads otherwise. Errors are
// shared the same way. However many clients poll, or flood, a page, its
// statements run at most once a lookEvery.
type looks[T any] struct {
	read func(ctx context.Context, sub string) (T, error)
	now  func() time.Time // the clock the age is judged by

	mu   sync.Mutex
	subs map[string]*look[T]
}

// look is one read of one key; done is closed when st and err are set,
// and at is when it completed.
type look[T any] struct {
	done chan struct{}
	at   time.Time
	st   T
	err  error
}

func newLooks[T any](read func(ctx context.Context, sub string) (T, error)) *looks[T] {
	return &looks[T]{read: read, now: time.Now, subs: map[string]*look[T]{}}
}

// get returns a look at sub no older than lookEvery. The request that
// finds none reads it, on a context of its own (its waiters must not get
// its cancellation); the others wait for that read, or their context.
func (ls *looks[T]) get(ctx context.Context, sub string) (T, error) {
	ls.mu.Lock()
	l, ok := ls.subs[sub]
	if ok && l.fresh(ls.now()) {
		ls.mu.Unlock()
		select {
		case <-l.done:
			return l.st, l.err
		case <-ctx.Done():
			var zero T
			return zero, ctx.Err()
		}
	}
	ls.sweep()
	l = &look[T]{done: make(chan struct{})}
	ls.subs[sub] = l
	ls.mu.Unlock()

	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookTimeout)
	defer cancel()
	var st T
	err := errors.New("console: the read did not complete")
	defer func() { // even when read panics, its waiters are answered
		ls.mu.Lock()
		l.st, l.err, l.at = st, err, ls.now()
		ls.mu.Unlock()
		close(l.done)
	}()
	st, err = ls.read(rctx, sub)
	return st, err
}

// fresh reports a look in flight, or one completed less than lookEvery
// before now. Called with ls.mu held.
func (l *look[T]) fresh(now time.Time) bool {
	select {
	case <-l.done:
		return now.Sub(l.at) < lookEvery
	default:
		return true
	}
}

// sweep forgets the looks that are no longer fresh, so that the map holds
// only the subscriptions watched in the last second. Called with ls.mu
// held.
func (ls *looks[T]) sweep() {
	now := ls.now()
	for sub, l := range ls.subs {
		if !l.fresh(now) {
			delete(ls.subs, sub)
		}
	}
}
