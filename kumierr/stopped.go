package kumierr

import "errors"

// ErrStopped is returned by the Start of every long-lived kumi service
// (actors.Runtime, actors.Group, leasestore.Store, eventsource's
// Sequencer, Notifier and ReadReplica, ...) once its Stop has been called,
// whatever happened before: a stopped service never starts again, make a
// new one (docs/design/architecture.md, "Lifecycle"). Test for it with
// errors.Is.
var ErrStopped = errors.New("kumi: the service was stopped; a stopped service cannot start again (make a new one)")
