package eventsource

import "github.com/kumi-run/kumi/internal/startstop"

// ErrStopped is returned by Start once Stop has been called, by every
// long-lived kumi service: a stopped service never starts again. It is the
// same error as leasestore.ErrStopped and actors.ErrStopped (see
// docs/design/architecture.md, "Lifecycle").
var ErrStopped = startstop.ErrStopped
