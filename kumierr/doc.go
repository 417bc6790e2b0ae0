// Package kumierr holds the error types that every kumi package returns
// alike, so that a caller tests for them in one way whichever package
// refused.
//
// It is a leaf: it imports nothing of kumi's and nothing outside the
// standard library, so the lowest package (eventsource) and the internal
// ones can return its errors, and a program can name them without pulling
// in the actor runtime or the database driver.
//
// # Invalid configuration
//
// Every constructor, Validate method and Start of kumi checks its options
// before it touches the database, and refuses the first invalid one with a
// [*ConfigError] naming the field:
//
//	_, err := rt.NewGroup(actors.GroupOptions{Subscription: "balances", Category: "account"})
//	var ce *kumierr.ConfigError
//	if errors.As(err, &ce) {
//		fmt.Println(ce.Field) // actors.GroupOptions.Buckets
//	}
//
// Package supervision classifies a [*ConfigError] as invalid
// configuration (its [ConfigError.ConfigError] method), so a supervised
// actor that meets one escalates instead of restarting in vain.
//
// # A stopped service
//
// Every long-lived kumi service returns [ErrStopped] from Start once Stop
// has been called: test for it with errors.Is, whichever package the
// service comes from.
package kumierr
