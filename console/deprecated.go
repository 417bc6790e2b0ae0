package console

// Member is the former name of [Worker] (kumi's former vocabulary called
// a worker of the pool a "member").
//
// Deprecated: use Worker.
type Member = Worker
