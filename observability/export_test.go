package observability

// For the tests of package observability_test.
var (
	ChangeKinds   = changeKinds
	DemoteHandler = demote
)
