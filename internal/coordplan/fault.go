package coordplan

// Fault re-injects one of the coordinator's past bugs, for the simulation
// to find (sim_test.go's TestSimFindsTheFaults); 0 is none. Only that test
// sets it.
type Fault uint8

// The faults, each a bug once fixed (its fix's test in parentheses).
const (
	// FaultNone: the plan as it is.
	FaultNone Fault = iota
	// FaultHaltIgnored: a stopping coordinator spawns readers again as
	// its readers end (fixed in 84a3b17: Abort waited out its timeout).
	FaultHaltIgnored
	// FaultGoneAtTerminated: a reader's end is acted on at once, ahead of
	// its last messages (actors: TestNoReaderIsSpawnedForASlotDrainedToTheCut).
	FaultGoneAtTerminated
	// FaultLostKept: a reader stopped on an unsure lease leaves its
	// holding owned, and is spawned again before a pass confirms it
	// (actors: TestAReaderStoppedUnsureIsNotRespawnedBeforeAPassConfirmsTheLease).
	FaultLostKept
	// FaultLostBySlot: a lost fence forgets the slot whatever the epoch
	// held now (actors: TestALostFenceOfAnOlderEpochLeavesTheLeaseHeldNow).
	FaultLostBySlot
	// FaultDrainedBySlot: a drained slot is known by its number, so a
	// claim of it after a cancel, at a new epoch, is held with no reader
	// (actors: TestADrainedBucketTakenAgainAfterACancelIsServed).
	FaultDrainedBySlot
	// FaultDrainedForgotten: a drain to the cut is not remembered, so a
	// pass that began before it spawns a reader for the drained holding.
	FaultDrainedForgotten
	// FaultToldOnce: a reader is told its slot's resize when it changes,
	// not on every pass: a reader that missed the message never learns it
	// (actors: TestACancelFollowedAtOnceByANewResizeCompletes).
	FaultToldOnce
)

// fault is the fault re-injected; FaultNone but in TestSimFindsTheFaults.
var fault Fault
