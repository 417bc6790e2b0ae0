package kumierr_test

import (
	"errors"
	"fmt"

	"github.com/kumi-run/kumi/kumierr"
)

// A caller tells invalid configuration from other failures, and learns the
// field to fix.
func ExampleConfigError() {
	err := fmt.Errorf("start: %w", &kumierr.ConfigError{Field: "actors.GroupOptions.Buckets", Value: 0, Reason: "must be at least 1"})
	var ce *kumierr.ConfigError
	if errors.As(err, &ce) {
		fmt.Println(ce.Field)
		fmt.Println(err)
	}
	// Output:
	// actors.GroupOptions.Buckets
	// start: kumi: invalid actors.GroupOptions.Buckets = 0: must be at least 1
}
