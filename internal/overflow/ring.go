package overflow

// ring is a growable FIFO over a power-of-two circular buffer. It is not
// safe for concurrent use; its owner locks. Popped slots are zeroed so the
// garbage collector can reclaim their messages, and a large, drained buffer
// is released so that a burst does not pin memory.
type ring[T any] struct {
	buf  []T
	head int
	n    int
}

const (
	ringMin         = 16
	ringReleaseOver = 1024 // an empty buffer above this size is released
)

func (r *ring[T]) len() int { return r.n }

func (r *ring[T]) push(v T) {
	if r.n == len(r.buf) {
		r.grow()
	}
	r.buf[(r.head+r.n)&(len(r.buf)-1)] = v
	r.n++
}

func (r *ring[T]) peek() (T, bool) {
	if r.n == 0 {
		var zero T
		return zero, false
	}
	return r.buf[r.head], true
}

func (r *ring[T]) pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) & (len(r.buf) - 1)
	r.n--
	if r.n == 0 {
		r.head = 0
		if len(r.buf) > ringReleaseOver {
			r.buf = nil
		}
	}
	return v, true
}

// clear drops every element and returns how many there were.
func (r *ring[T]) clear() int {
	n := r.n
	clear(r.buf)
	r.head, r.n = 0, 0
	if len(r.buf) > ringReleaseOver {
		r.buf = nil
	}
	return n
}

func (r *ring[T]) grow() {
	size := max(ringMin, 2*len(r.buf))
	buf := make([]T, size)
	if r.n > 0 {
		k := copy(buf, r.buf[r.head:])
		copy(buf[k:], r.buf[:r.head])
	}
	r.buf, r.head = buf, 0
}
