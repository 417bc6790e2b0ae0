package observability

import (
	"go.opentelemetry.io/otel/attribute"

	"github.com/kumi-run/kumi/internal/obsname"
)

// slotSize is the store's slot width: a slot is generation × slotSize +
// bucket (eventsource.Slot; TestSlotSplitIsTheStores holds the two
// together without making this package import the store).
const slotSize = 1 << 16

// slotGeneration and slotBucket split a slot, the number the runtime
// keys its readers and the store its checkpoints by, into the generation
// and the bucket within it that operators see (`kumi status`, /status).
func slotGeneration(slot int) int { return slot / slotSize }

func slotBucket(slot int) int { return slot % slotSize }

// bucketAttrs are a slot's attributes: its generation and its bucket.
func bucketAttrs(slot int) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.Int(obsname.AttrGeneration, slotGeneration(slot)),
		attribute.Int(obsname.AttrBucket, slotBucket(slot)),
	}
}
