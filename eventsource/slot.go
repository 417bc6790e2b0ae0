package eventsource

import "fmt"

// MaxGeneration is the highest generation a subscription can reach: a slot
// is an int4 in the checkpoint and lease tables, and
// MaxGeneration×MaxGroupSize + MaxGroupSize−1 = 2³¹−1. A subscription can
// be resized MaxGeneration times (docs/design/resize.md).
const MaxGeneration = 1<<15 - 1

// Slot is the key of a subscription's bucket in the checkpoint and lease
// tables: generation×[MaxGroupSize] + bucket. A subscription's bucket count
// can change online (docs/design/resize.md); each count is a generation, 0 at
// creation, and its buckets' checkpoints and leases are keyed by slot. For
// generation 0 the slot is the bucket itself, so a subscription never
// resized reads as it always did. It panics outside generation
// [0, MaxGeneration] and bucket [0, MaxGroupSize): both are the caller's
// bug, never data.
func Slot(generation, bucket int) int {
	if generation < 0 || generation > MaxGeneration || bucket < 0 || bucket >= MaxGroupSize {
		panic(fmt.Sprintf("eventsource: no slot for generation %d bucket %d (generations 0 to %d, buckets 0 to %d)",
			generation, bucket, MaxGeneration, MaxGroupSize-1))
	}
	return generation*MaxGroupSize + bucket
}

// SlotBucket splits a slot into its generation and its bucket within that
// generation: the inverse of [Slot]. A negative slot panics.
func SlotBucket(slot int) (generation, bucket int) {
	if slot < 0 {
		panic(fmt.Sprintf("eventsource: slot %d is negative", slot))
	}
	return slot / MaxGroupSize, slot % MaxGroupSize
}
