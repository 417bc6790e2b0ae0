package actors

import (
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kumi-run/kumi/internal/kitbridge"
	"github.com/kumi-run/kumi/internal/supervisor"
	"github.com/kumi-run/kumi/supervision"
)

// The handler test kit (package kumitest) runs a user's handler through
// the path a group's reader uses: the same middleware, *Delivery and
// *Batch messages with their answer's address, and replies read by
// classifyAnswer, classifyBatchAnswer and retryVerdict. It reaches them through internal/kitbridge, set here, so
// that this package exports nothing for it.
func init() {
	kitbridge.Props = func(user *actor.Props, supervisor *supervisor.Strategy) *actor.Props {
		return handlerProps(user, supervisor, kitDispatcher)
	}
	kitbridge.Deliver = kitDeliver
	kitbridge.Unwrap = func(msg any) (kitbridge.Reply, bool) {
		r, ok := msg.(*handlerReply)
		if !ok {
			return kitbridge.Reply{}, false
		}
		return kitbridge.Reply{ID: r.id, Attempt: r.attempt, Msg: r.msg}, true
	}
	kitbridge.Classify = func(res any, err error, timeout time.Duration) kitbridge.Meaning {
		a := classifyAnswer(res, err, timeout)
		return kitbridge.Meaning{Outcome: a.outcome, Committed: a.committed, After: a.after, Reason: a.reason, Warn: a.warn}
	}
	kitbridge.ClassifyBatch = func(res any, n int) kitbridge.BatchMeaning {
		m := classifyBatchAnswer(res, n)
		return kitbridge.BatchMeaning{All: m.all, Committed: m.committed, Done: m.done, Alone: m.alone, Next: m.next, Warn: m.warn}
	}
	kitbridge.RetryVerdict = func(maxAttempts int, backoff supervision.Backoff, attempt, free int, after time.Duration, reason string) (bool, time.Duration, string) {
		return retryVerdict(RetryPolicy{MaxAttempts: maxAttempts, Backoff: backoff}, attempt, free, after, reason)
	}
	kitbridge.ID = func(msg any) (uint64, bool) {
		if d := deliveryOf(msg); d != nil {
			return d.id, true
		}
		return 0, false
	}
}

// kitDispatcher runs the kit's handlers: protoactor's default.
var kitDispatcher = actor.NewDefaultDispatcher(300)

// kitDeliver makes the Delivery, or the Batch, m describes.
func kitDeliver(m kitbridge.Message) (any, uint64) {
	d := &Delivery{Event: m.Event, Attempt: m.Attempt, Subscription: m.Subscription, Generation: m.Generation,
		Bucket: m.Bucket, Epoch: m.Epoch, Fence: m.Fence, Context: m.Context,
		id: answerIDs.Add(1), replyTo: m.ReplyTo, exclusive: m.Exclusive}
	if m.Events == nil {
		return d, d.id
	}
	d.Event = m.Events[0]
	return &Batch{Events: m.Events, Attempt: m.Attempt, Subscription: m.Subscription, Generation: m.Generation,
		Bucket: m.Bucket, Epoch: m.Epoch, Fence: m.Fence, Context: m.Context, d: d}, d.id
}
