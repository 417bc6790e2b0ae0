package console

import (
	"sync"
	"time"
)

// The charts' history: what the console's looks at a subscription saw, a
// point per seriesStep over the last seriesSpan, kept in memory while the
// console runs (the tables keep no history of lag).
const (
	seriesStep = 10 * time.Second
	seriesSpan = time.Hour
)

// seriesPoint is one sample of a subscription for the console's charts.
type seriesPoint struct {
	At   time.Time `json:"at"`   // the database's clock at the look
	Head int64     `json:"head"` // the store's last sequenced position
	// Lag is the events after every bucket's checkpoint, summed; -1 when
	// the category is unknown (lag is not measured).
	Lag int64 `json:"lag"`
}

// series keeps, per subscription, the last point of each seriesStep over
// the last seriesSpan.
type series struct {
	step, span time.Duration

	mu   sync.Mutex
	subs map[string][]seriesPoint // oldest first
}

func newSeries() *series {
	return &series{step: seriesStep, span: seriesSpan, subs: map[string][]seriesPoint{}}
}

// maxCharted bounds the subscriptions charted; the one looked at longest
// ago is dropped first.
const maxCharted = 256

// add records p for sub and returns sub's points, oldest first: p
// replaces the last point when both fall in one step; points older than
// the span before p are dropped, and a look older than the last is not
// recorded (two reads crossing).
func (s *series) add(sub string, p seriesPoint) []seriesPoint {
	s.mu.Lock()
	defer s.mu.Unlock()
	ps, ok := s.subs[sub]
	if !ok && len(s.subs) >= maxCharted {
		s.evictOldest()
	}
	switch n := len(ps); {
	case n > 0 && p.At.Before(ps[n-1].At):
	case n > 0 && p.At.Truncate(s.step).Equal(ps[n-1].At.Truncate(s.step)):
		ps[n-1] = p
	default:
		ps = append(ps, p)
	}
	drop := 0
	for drop < len(ps) && ps[drop].At.Before(p.At.Add(-s.span)) {
		drop++
	}
	ps = append([]seriesPoint(nil), ps[drop:]...)
	s.subs[sub] = ps
	return append([]seriesPoint(nil), ps...)
}

func (s *series) evictOldest() {
	var oldest string
	var at time.Time
	for name, ps := range s.subs {
		if last := ps[len(ps)-1].At; oldest == "" || last.Before(at) {
			oldest, at = name, last
		}
	}
	delete(s.subs, oldest)
}
