package actors

import (
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/kumi-run/kumi/supervision"
)

// GroupFailedError is why a group ended on a failure it cannot recover
// from: a reader hit a configuration error (a missing table or grant), or
// the coordinator exhausted its restart budget. [Group.Err] and
// [Group.Stop] return it; the group has released its leases (best effort),
// so that healthy workers take its buckets over at once.
type GroupFailedError struct {
	// Subscription is the group's.
	Subscription string
	// Class is the failure's supervision class, e.g. supervision.Config.
	Class supervision.Class
	// Fix says what an operator can do about it.
	Fix string
	// Err is the failure.
	Err error
}

// Error names the subscription, the class, the failure and the fix.
func (e *GroupFailedError) Error() string {
	return fmt.Sprintf("kumi: group %q stopped on a %s failure: %v (fix: %s)", e.Subscription, e.Class, e.Err, e.Fix)
}

// Unwrap returns the failure.
func (e *GroupFailedError) Unwrap() error { return e.Err }

// newGroupFailedError describes the failure that made the coordinator's
// guardian stop it: the cause, and what an operator can do about it.
func newGroupFailedError(subscription string, d supervision.Decision) *GroupFailedError {
	return &GroupFailedError{Subscription: subscription, Class: d.Class, Err: d.Reason, Fix: fixFor(d)}
}

// fixFor says what to do about a failure that stopped a group.
func fixFor(d supervision.Decision) string {
	var pgErr *pgconn.PgError
	if errors.As(d.Reason, &pgErr) {
		switch {
		case pgErr.Code == "42P01":
			return "a table kumi needs is missing: run `kumi migrate` against this schema with the owner role, " +
				"or check the schema name the worker is given"
		case pgErr.Code == "42501":
			return "the worker's database role lacks a privilege: grant it what docs/operations.md " +
				"(Database roles) lists for workers"
		case pgErr.Code == "3F000":
			return "the schema does not exist: check the schema name, or run `kumi migrate`"
		case pgErr.Code == "3D000":
			return "the database does not exist: check the database URL"
		case strings.HasPrefix(pgErr.Code, "28"):
			return "the database refused the worker's credentials: check the database URL's user and password"
		}
	}
	if d.Class == supervision.Config {
		return "correct the configuration the error names, then restart the worker"
	}
	return "the group's coordinator failed more often than its restart budget allows: " +
		"look for the cause in the error and the supervision logs, then restart the worker"
}
