package kumierr

import "fmt"

// ConfigError reports a configuration field that kumi refuses: out of its
// range, missing, or at odds with another field.
type ConfigError struct {
	// Field names the field as a Go name qualified by its package and the
	// type the caller filled in, with the path to it:
	// "actors.GroupOptions.Buckets", "actors.GroupOptions.Lease.TTL",
	// "leasestore.Config.Heartbeat", "console.Options.Token". An argument
	// that is not a field is named by its package and its name, followed
	// by the path into it: "eventsource pool", "leasestore schema",
	// "actors groups[1].Buckets".
	Field string
	// Value is the value refused, or nil when there is none to show (a
	// missing value, or a secret such as a token or a connection string,
	// which is never repeated).
	Value any
	// Reason says what is wrong and what is accepted.
	Reason string
	// Err, when set, is the sentinel the error wraps, so that errors.Is
	// tells one refusal from another without parsing Reason: a read pool
	// that is not a standby of the store's primary
	// (eventsource.ErrReplicaMismatch), a resize whose index is missing
	// (leasestore.ErrIndexMissing). Its text is not repeated in Error.
	Err error
}

// Error returns "kumi: invalid <Field> = <Value>: <Reason>", without
// " = <Value>" when Value is nil.
func (e *ConfigError) Error() string {
	switch v := e.Value.(type) {
	case nil:
		return "kumi: invalid " + e.Field + ": " + e.Reason
	case string:
		return fmt.Sprintf("kumi: invalid %s = %q: %s", e.Field, v, e.Reason)
	default:
		return fmt.Sprintf("kumi: invalid %s = %v: %s", e.Field, v, e.Reason)
	}
}

// Unwrap returns Err.
func (e *ConfigError) Unwrap() error { return e.Err }

// ConfigError reports true: the error is a supervision.ConfigMarker, so
// supervision classifies it as invalid configuration.
func (e *ConfigError) ConfigError() bool { return true }
