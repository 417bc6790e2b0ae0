package observability

// AttrMembers is the former name of [AttrLiveWorkers] (kumi's former
// vocabulary called a worker of the pool a "member"); it is now the same
// attribute, kumi.live_workers.
//
// Deprecated: use AttrLiveWorkers.
const AttrMembers = AttrLiveWorkers
