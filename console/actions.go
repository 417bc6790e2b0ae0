package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/google/uuid"

	"github.com/kumi-run/kumi/eventsource"
	"github.com/kumi-run/kumi/internal/admin"
	"github.com/kumi-run/kumi/internal/redact"
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

// adminStatus is the HTTP answer to an admin.Refusal of each kind.
var adminStatus = map[admin.Kind]int{
	admin.BadInput: http.StatusBadRequest,
	admin.NotFound: http.StatusNotFound,
	admin.Conflict: http.StatusConflict,
}

// act runs one action, logs it and answers {"message": …} or {"error": …}.
func (c *Console) act(w http.ResponseWriter, r *http.Request, action string, attrs []any, do func(context.Context) (string, error)) {
	attrs = append([]any{"action", action, "subscription", r.PathValue("sub"), "remote", r.RemoteAddr}, attrs...)
	msg, err := do(r.Context())
	if err != nil {
		status := statusOf(err)
		var ref *refusal
		var adm *admin.Refusal
		switch {
		case errors.As(err, &ref):
			status = ref.status
		case errors.As(err, &adm):
			status = adminStatus[adm.Kind]
		}
		c.log.Warn("console action refused or failed", append(attrs, "status", status, "err", redact.URL(err.Error()))...)
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
// owner), through admin.Relinquish as `kumi relinquish` does.
func relinquish(ctx context.Context, store *eventsource.Store, sub string, bucket int, to string) (string, error) {
	h, err := admin.Relinquish(ctx, store, sub, bucket, to)
	if err != nil {
		return "", err
	}
	msg := fmt.Sprintf("asked %s to hand bucket %d (epoch %d) over to %s", h.Owner, bucket, h.Epoch, h.To)
	if h.AboveShare {
		msg += fmt.Sprintf("; %s already holds its fair share (%d of %d), so it may withdraw the claim and %s keep the bucket",
			h.To, h.Load, h.Share, h.Owner)
	}
	return msg, nil
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

// resetCheckpoint sets sub's checkpoint of bucket to position through
// admin.ResetCheckpoints, as `kumi checkpoints reset` does.
func resetCheckpoint(ctx context.Context, store *eventsource.Store, sub string, bucket int, position int64, force, beyond bool) (string, error) {
	rs, err := admin.ResetCheckpoints(ctx, store, admin.Reset{Subscription: sub, Buckets: []int{bucket},
		Position: position, Force: force, BeyondHead: beyond})
	if err != nil {
		return "", err
	}
	r := rs[0]
	if r.Refused != nil {
		return "", r.Refused
	}
	msg := fmt.Sprintf("bucket %d: checkpoint %d -> %d", bucket, r.Before, position)
	switch out := r.Fenced; {
	case out.Live:
		msg += fmt.Sprintf("; its live owner %s was fenced out (epoch %d -> %d): its reader restarts from the new "+
			"checkpoint on its next pass, and what its old reader delivers until then may be delivered again",
			out.Owner, out.Epoch-1, out.Epoch)
	case out.Found:
		msg += fmt.Sprintf("; earlier holders fenced out (epoch %d -> %d)", out.Epoch-1, out.Epoch)
	}
	return msg, nil
}

// letterOf parses the event id of a letter action and reads the letter
// (admin.Letter: one replayed already is refused unless again).
func (c *Console) letterOf(ctx context.Context, r *http.Request, again bool) (eventsource.DeadLetter, error) {
	id, err := uuid.Parse(r.PathValue("id"))
	if err != nil {
		return eventsource.DeadLetter{}, refuse(http.StatusBadRequest, "%q is not an event id (a UUID)", r.PathValue("id"))
	}
	return admin.Letter(ctx, c.opts.Store, r.PathValue("sub"), id, again)
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
		d, err := c.letterOf(ctx, r, false)
		if err != nil {
			return "", err
		}
		if err := admin.Replay(ctx, c.opts.Store, d, false, func(ctx context.Context, ev eventsource.RecordedEvent) error {
			return c.opts.Replay(ctx, d.Subscription, ev)
		}); err != nil {
			var ref *admin.Refusal
			if errors.As(err, &ref) {
				return "", err
			}
			return "", fmt.Errorf("%w (the letter stays pending, its attempts counted)", err)
		}
		return fmt.Sprintf("replayed event %s (position %d); checkpoints unchanged", d.EventID, d.Position), nil
	})
}

// discardAction deletes one letter (its event stays in the store).
func (c *Console) discardAction(w http.ResponseWriter, r *http.Request) {
	c.act(w, r, "discard", []any{"event", r.PathValue("id")}, func(ctx context.Context) (string, error) {
		d, err := c.letterOf(ctx, r, true)
		if err != nil {
			return "", err
		}
		if err := admin.Discard(ctx, c.opts.Store, d.Subscription, d.EventID); err != nil {
			return "", err
		}
		return fmt.Sprintf("discarded the dead letter of event %s; the event stays in the store", d.EventID), nil
	})
}

// parkedAction acts on a parked stream, as `kumi parked replay|discard|skip`
// does: POST …/parked/{replay,discard,skip}?stream=S, and for skip
// confirm=S (the stream's name again: a skip cannot be undone). The
// stream's reader carries a release out under its lease.
func (c *Console) parkedAction(w http.ResponseWriter, r *http.Request) {
	action, stream := r.PathValue("action"), r.FormValue("stream")
	c.act(w, r, "parked "+action, []any{"stream", stream}, func(ctx context.Context) (string, error) {
		ps, err := admin.ParkedStream(ctx, c.opts.Store, admin.Park{Subscription: r.PathValue("sub"), Stream: stream,
			Action: eventsource.ParkAction(action), Confirm: r.FormValue("confirm")})
		if err != nil {
			return "", err
		}
		if ps.Action == eventsource.ParkSkip {
			return fmt.Sprintf("stream %s is skipped for good: its %d waiting events and later ones are not delivered", ps.Stream, ps.Waiting), nil
		}
		return fmt.Sprintf("asked to %s stream %s: the reader of its bucket delivers its %d waiting events in order, then the stream flows again",
			ps.Action, ps.Stream, ps.Waiting), nil
	})
}
