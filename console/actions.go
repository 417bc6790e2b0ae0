package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/inspect"
	"github.com/kumi-run/kumi/leasestore"
)

// refusal is an action the console will not take, and why: its status is
// the HTTP answer (400 bad input, 404 unknown, 409 the state forbids it).
type refusal struct {
	status int
	msg    string
}

func (r *refusal) Error() string { return r.msg }

func refuse(status int, format string, args ...any) error {
	return &refusal{status: status, msg: fmt.Sprintf(format, args...)}
}

// act runs one action, logs it and answers {"message": …} or {"error": …}.
func (c *Console) act(w http.ResponseWriter, r *http.Request, action string, attrs []any, do func(context.Context) (string, error)) {
	attrs = append([]any{"action", action, "subscription", r.PathValue("sub"), "remote", r.RemoteAddr}, attrs...)
	msg, err := do(r.Context())
	if err != nil {
		status := statusOf(err)
		var ref *refusal
		if errors.As(err, &ref) {
			status = ref.status
		}
		c.log.Warn("console action refused or failed", append(attrs, "status", status, "err", inspect.RedactURL(err.Error()))...)
		writeError(w, status, err.Error())
		return
	}
	c.log.Info("console action", append(attrs, "outcome", msg)...)
	writeJSON(w, map[string]string{"message": msg})
}

// relinquishAction asks a bucket's owner to hand it over.
func (c *Console) relinquishAction(w http.ResponseWriter, r *http.Request) {
	sub := r.PathValue("sub")
	bucket, err := strconv.Atoi(r.PathValue("bucket"))
	to := r.FormValue("to")
	c.act(w, r, "relinquish", []any{"bucket", r.PathValue("bucket"), "to", to}, func(ctx context.Context) (string, error) {
		if err != nil || bucket < 0 {
			return "", refuse(http.StatusBadRequest, "bucket %q: buckets are numbered from 0", r.PathValue("bucket"))
		}
		return relinquish(ctx, c.opts.Store, sub, bucket, to)
	})
}

// relinquish asks the owner of bucket to hand it over to the live worker
// to (or, when to is "", the least loaded live worker other than the
// owner): leasestore.RequestHandoff, as `kumi relinquish` calls it, with
// its refusals as 400 (bad input), 404 (no such subscription) or 409 (the
// lease state forbids it).
func relinquish(ctx context.Context, store *eventsource.Store, sub string, bucket int, to string) (string, error) {
	if err := eventsource.ValidateSubscription(sub); err != nil {
		return "", err
	}
	// The bucket is the serving generation's, as the map shows it.
	slot, err := inspect.ServingSlot(ctx, store, sub, bucket)
	if err != nil {
		return "", err
	}
	req, err := leasestore.RequestHandoff(ctx, store.Pool(), store.Schema(), sub, slot, to)
	var h *leasestore.HandoffError
	switch {
	case errors.As(err, &h):
		return "", handoffRefusal(h)
	case err != nil:
		return "", fmt.Errorf("place the claim: %w", err)
	}
	msg := fmt.Sprintf("asked %s to hand bucket %d (epoch %d) over to %s", req.Owner, bucket, req.Epoch, req.To)
	if share := leasestore.FairShare(req.Buckets, max(req.Live, 1)); req.Load >= share {
		msg += fmt.Sprintf("; %s already holds its fair share (%d of %d), so it may withdraw the claim and %s keep the bucket",
			req.To, req.Load, share, req.Owner)
	}
	return msg, nil
}

// handoffRefusal words a refused handoff request as `kumi relinquish` does.
func handoffRefusal(h *leasestore.HandoffError) error {
	_, bucket := eventsource.SlotBucket(h.Bucket)
	row, sub := h.Lease, h.Subscription
	switch h.Reason {
	case leasestore.ErrNoBuckets:
		return refuse(http.StatusNotFound, "subscription %q has no buckets: no worker has started it", sub)
	case leasestore.ErrBucketOutOfRange:
		return refuse(http.StatusBadRequest, "bucket %d: subscription %q has buckets 0 to %d", bucket, sub, h.Buckets-1)
	case leasestore.ErrBucketFree:
		return refuse(http.StatusConflict, "bucket %d has no owner: nothing to hand over (a worker below its fair share claims it on its next pass)", bucket)
	case leasestore.ErrLeaseExpired:
		return refuse(http.StatusConflict, "bucket %d's lease (owner %s) has expired: the next pass of any worker takes it without a handoff", bucket, row.Owner)
	case leasestore.ErrClaimPending:
		return refuse(http.StatusConflict, "bucket %d already has a pending claim by %s: its owner %s is handing it over", bucket, row.ClaimWorker, row.Owner)
	case leasestore.ErrTargetIsOwner:
		return refuse(http.StatusBadRequest, "%s is the bucket's owner", h.To)
	case leasestore.ErrTargetNotLive:
		return refuse(http.StatusBadRequest, "%s is not a live worker of %q", h.To, sub)
	case leasestore.ErrNoOtherWorker:
		return refuse(http.StatusConflict, "%s is the only live worker of %q: nobody could take bucket %d", row.Owner, sub, bucket)
	default: // leasestore.ErrHandoffRaced
		return refuse(http.StatusConflict, "bucket %d changed while the claim was placed (owner, claim or %s's liveness): look again and retry", bucket, h.To)
	}
}

// resetAction sets a bucket's checkpoint, as `kumi checkpoints reset`
// does: POST …/buckets/B/reset?position=P, with force=1 to fence out a
// live owner and beyond_head=1 to accept a position past the store's head.
func (c *Console) resetAction(w http.ResponseWriter, r *http.Request) {
	sub, bucketText, posText := r.PathValue("sub"), r.PathValue("bucket"), r.FormValue("position")
	forceText, beyondText := r.FormValue("force"), r.FormValue("beyond_head")
	c.act(w, r, "reset", []any{"bucket", bucketText, "position", posText, "force", forceText, "beyond_head", beyondText},
		func(ctx context.Context) (string, error) {
			bucket, err := strconv.Atoi(bucketText)
			if err != nil || bucket < 0 {
				return "", refuse(http.StatusBadRequest, "bucket %q: buckets are numbered from 0", bucketText)
			}
			position, err := strconv.ParseInt(posText, 10, 64)
			if err != nil || position < 0 {
				return "", refuse(http.StatusBadRequest, "position %q: the new checkpoint is a global position, an integer >= 0", posText)
			}
			force, err := flag("force", forceText)
			if err != nil {
				return "", err
			}
			beyond, err := flag("beyond_head", beyondText)
			if err != nil {
				return "", err
			}
			return resetCheckpoint(ctx, c.opts.Store, sub, bucket, position, force, beyond)
		})
}

// flag reads a yes/no action parameter: absent, "0" or "false" is no.
func flag(name, v string) (bool, error) {
	b, err := strconv.ParseBool(v)
	if v == "" {
		b, err = false, nil
	}
	if err != nil {
		return false, refuse(http.StatusBadRequest, "%s=%q: say 1 or 0", name, v)
	}
	return b, nil
}

// resetCheckpoint sets sub's checkpoint of bucket to position with `kumi
// checkpoints reset`'s rules: an unknown subscription and a bucket out of
// range are refused, a position past the store's head too unless beyond,
// and a bucket a live owner holds unless force. The write runs behind
// leasestore.OperatorFence, so no earlier holder of the bucket — a lapsed
// owner that comes back, or the live one when forced — writes over it.
func resetCheckpoint(ctx context.Context, store *eventsource.Store, sub string, bucket int, position int64, force, beyond bool) (string, error) {
	if err := eventsource.ValidateSubscription(sub); err != nil {
		return "", err
	}
	n, known, err := inspect.Known(ctx, store, sub)
	switch {
	case err != nil:
		return "", err
	case !known:
		return "", refuse(http.StatusNotFound, "subscription %q is unknown: it has no buckets, checkpoints or dead letters", sub)
	case n > 0 && bucket >= n:
		return "", refuse(http.StatusBadRequest, "bucket %d: subscription %q has buckets 0 to %d", bucket, sub, n-1)
	}
	head, err := store.HeadPosition(ctx)
	if err != nil {
		return "", err
	}
	if position > head && !beyond {
		return "", refuse(http.StatusBadRequest, "position %d is past the store's head (%d): the bucket would skip every "+
			"event until the head passes %d; allow a position beyond the head if that is what you want", position, head, position)
	}
	// The bucket is the serving generation's, as the map shows it (a
	// retired generation's checkpoints are its record, never reset).
	slot, err := inspect.ServingSlot(ctx, store, sub, bucket)
	if err != nil {
		return "", err
	}
	before, err := store.Checkpoint(ctx, sub, slot)
	if err != nil {
		return "", err
	}
	var out leasestore.FencedOut
	err = store.ResetCheckpoint(ctx, sub, slot, position, leasestore.OperatorFence(store.Schema(), sub, slot, force, &out))
	var held *leasestore.HeldError
	switch {
	case errors.As(err, &held):
		return "", refuse(http.StatusConflict, "bucket %d is held by %s (epoch %d, lease expires in %v): stop the "+
			"subscription's workers (or wait until none holds it) and retry, or force it (the owner is then fenced out "+
			"and its reader restarts from the new checkpoint)", bucket, held.Owner, held.Epoch, held.ExpiresIn.Round(time.Second))
	case err != nil:
		return "", err
	}
	msg := fmt.Sprintf("bucket %d: checkpoint %d -> %d", bucket, before, position)
	switch {
	case out.Live:
		msg += fmt.Sprintf("; its live owner %s was fenced out (epoch %d -> %d): its reader restarts from the new "+
			"checkpoint on its next pass, and what its old reader delivers until then may be delivered again",
			out.Owner, out.Epoch-1, out.Epoch)
	case out.Found:
		msg += fmt.Sprintf("; earlier holders fenced out (epoch %d -> %d)", out.Epoch-1, out.Epoch)
	}
	return msg, nil
}

// letterOf parses the event id of a letter action and reads the letter.
func (c *Console) letterOf(ctx context.Context, r *http.Request) (eventsource.DeadLetter, error) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return eventsource.DeadLetter{}, refuse(http.StatusBadRequest, "%q is not an event id (a UUID)", r.PathValue("id"))
	}
	return c.opts.Store.DeadLetter(ctx, r.PathValue("sub"), id)
}

// replayAction replays one pending letter through Options.Replay, as `kumi
// dead-letters replay --event ID` does: the letter is claimed for the
// handler's duration and marked replayed when it succeeds; checkpoints are
// never moved.
func (c *Console) replayAction(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, "replay", []any{"event", r.PathValue("id")}, func(ctx context.Context) (string, error) {
		if c.opts.Replay == nil {
			return "", refuse(http.StatusForbidden, "replay is not available: the console has no replay handler "+
				"(Options.Replay, or kumi console --replay-exec)")
		}
		d, err := c.letterOf(ctx, r)
		if err != nil {
			return "", err
		}
		if d.ReplayedAt != nil {
			return "", refuse(http.StatusConflict, "event %s was already replayed at %s", d.EventID,
				d.ReplayedAt.UTC().Format("2006-01-02T15:04:05Z"))
		}
		b := d.Bucket
		n, err := c.opts.Store.ReplayDeadLetters(ctx, d.Subscription,
			eventsource.DeadLetterFilter{Bucket: &b, After: d.Position - 1, Limit: 1},
			func(ctx context.Context, ev eventsource.RecordedEvent) error {
				if ev.ID != d.EventID {
					return fmt.Errorf("expected event %s, was handed %s (another replay ran at once?)", d.EventID, ev.ID)
				}
				return c.opts.Replay(ctx, d.Subscription, ev)
			})
		if err != nil {
			return "", fmt.Errorf("%w (the letter stays pending, its attempts counted)", err)
		}
		if n == 0 {
			return "", refuse(http.StatusConflict, "event %s was not replayed: another replay holds it, or it was replayed meanwhile", d.EventID)
		}
		return fmt.Sprintf("replayed event %s (position %d); checkpoints unchanged", d.EventID, d.Position), nil
	})
}

// discardAction deletes one letter (its event stays in the store).
func (c *Console) discardAction(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, "discard", []any{"event", r.PathValue("id")}, func(ctx context.Context) (string, error) {
		d, err := c.letterOf(ctx, r)
		if err != nil {
			return "", err
		}
		ok, err := c.opts.Store.DeleteDeadLetter(ctx, d.Subscription, d.EventID)
		if err != nil {
			return "", err
		}
		if !ok {
			return "", refuse(http.StatusNotFound, "%q has no dead letter for event %s (discarded meanwhile?)", d.Subscription, d.EventID)
		}
		return fmt.Sprintf("discarded the dead letter of event %s; the event stays in the store", d.EventID), nil
	})
}
