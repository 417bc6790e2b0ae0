// Package eventsource is kumi's event store on PostgreSQL: streams of JSON
// events with optimistic concurrency, a global order that a subscriber can
// follow from a checkpoint without ever skipping an event, consumer-group
// reads, fenced checkpoints, dead letters, and a LISTEN/NOTIFY notifier.
// The actor runtime (package actors) subscribes through it; the lease
// store (package leasestore) gates its checkpoint writes with a [Fence].
//
// A [Store] is a pgx pool plus a schema name. [New] builds one without
// touching the database; [Store.Migrate] creates or upgrades the schema.
// Every process that appends or subscribes also runs a [Sequencer] and,
// usually, one [Notifier]:
//
//	store, err := eventsource.New(pool, eventsource.Config{Schema: "kumi"})
//	err = store.Migrate(ctx)
//	seq := eventsource.NewSequencer(store, eventsource.SequencerOptions{})
//	err = seq.Start(ctx)
//	defer seq.Stop(context.Background())
//
// # Streams
//
// A stream is named "category-id": the category is the text before the
// first '-', the id the rest. The cardinal id is the id before any '+', so
// "account-7+snapshot" belongs with "account-7" in consumer groups.
// [ParseStreamName] validates and splits a name; an invalid one (empty
// category or id, over [MaxStreamNameLength] bytes, invalid UTF-8, C0 and
// C1 control characters including NUL, bidirectional formatting
// characters, surrounding white space: see [ValidateName]) is refused with
// a [*NameError] wrapping [ErrInvalidName], and nothing is written.
//
// # Appending
//
// [Store.Append] writes a batch of [EventData] to one stream atomically, in
// a single statement, if its [ExpectedVersion] holds: [Any], [NoStream],
// [StreamExists] or [Exact](v). Versions are 0-based. A conflict is a
// [*WrongExpectedVersionError] carrying the stream's actual version;
// nothing is written. [Store.AppendTx] does the same inside the caller's
// pgx transaction. Event ids are UUIDv7 unless given; an id the store
// already has is refused ([ErrDuplicateEventID]) with the whole batch,
// never silently skipped. Data is JSON; metadata, when given, a JSON
// object; both are checked before anything is sent ([*EventError]),
// bounded by [Config].MaxEventSize both as given and as a read gives them
// back (jsonb writes numbers out in full), and a batch by MaxBatchEvents
// and MaxBatchBytes. When
// the append's context carries an OpenTelemetry span, its W3C trace
// context is added to the metadata, and [TraceContext] restores it on the
// handler's side.
//
// An append locks only its stream's row, so appends to different streams
// never wait for each other.
//
// # Global order without skipped events
//
// Each event gets a global position, its place in the store-wide order
// that readers follow with "position > cursor". Positions are not handed
// out by the append (a sequence value taken before commit can commit after
// a larger one, and a reader that has moved past it would skip it).
// Instead a [Sequencer] assigns them after commit: [Store.Sequence] takes
// the single sequencer row FOR UPDATE SKIP LOCKED, then, in a fresh
// statement that sees every committed event, numbers the committed appends
// that have no position yet in insertion order, continuing from the last
// position, and commits. It numbers appends, not events: each append
// writes one narrow row, the range of versions it added to its stream, and
// an event's position is its range's last position less the versions
// after it in the range, so an append of 100 events costs the sequencer
// one row; reads join the ranges to the events. One sequencer runs at a time across all
// processes; the others skip. An event that commits late is simply
// numbered later, after every position a reader can already have passed.
// A stream's events are numbered in version order because an append to a
// stream only takes its insertion number once the previous append to the
// stream has committed, and within an append positions follow versions. Until it is sequenced, an event is in its stream
// ([Store.ReadStream], with Position 0) but not in global order. The
// sequencer's search for unsequenced events starts at a watermark below
// which everything is known to be sequenced or rolled back, so that it
// never wades through the index entries its own updates left behind
// (docs/design/eventsource.md has the argument that this is safe).
//
// Each sequencer transaction sets its own statement and lock timeouts, so
// a role's or a database's statement_timeout cannot stop it; a step cut
// by a timeout all the same is retried with half the batch. A failed step
// is retried after an exponential backoff with jitter, and
// [Sequencer.Stats] (and a log line) report a backlog that is stuck, and
// why. A reset of the sequence behind the insertion numbers is found and
// recovered from without skipping anything ([SequenceResetError]).
//
// docs/design/eventsource.md compares this with the alternatives (a lock per
// category, an xid/xmin watermark) and lists its costs.
//
// # Reading
//
// [Store.ReadStream] and [Store.ReadStreamBackward] page through a stream
// by version. [Store.ReadCategory], [Store.ReadAll] and [Store.ReadBucket]
// page through global order from a position (exclusive). [Store.HeadPosition]
// is the last position handed out; [Store.BucketLag] is a bucket's backlog,
// [Store.BucketLags] many buckets' in one statement.
//
// # Consumer groups
//
// A group of n buckets splits a category by stream: bucket
// [BucketOfHash]([Hash](cardinal id), n). [Hash] is the first 8 bytes of the MD5
// of the cardinal id as a big-endian signed integer, computed identically
// by the SQL function cg_hash, and stored with every event so that a
// bucket's read never hashes rows. [Store.EnsureConsumerGroupIndex] builds
// (concurrently, without blocking appends) the index that makes
// [Store.ReadBucket] for a group of n a range scan; n is at most
// [MaxGroupSize].
//
// # Unreadable events
//
// An event the store holds but PostgreSQL cannot give back (written by SQL
// or an older version: its row fails to print) never fails a read: the
// read returns it in its place with [RecordedEvent].Err set to an
// [*UnreadableEventError], and a subscription dead-letters it.
//
// # Checkpoints and fences
//
// A subscription's progress is a [Checkpoint] per (subscription, bucket).
// [Store.SaveCheckpoint] only moves it forward (GREATEST), and takes a
// [Fence] that is checked inside the write's transaction: a worker that
// lost its bucket (a zombie) gets the fence's error, wrapping
// [ErrFenceLost], and its write changes nothing. [Store.SaveCheckpointTx]
// does it inside the caller's transaction, so that a handler can commit
// its own writes and the checkpoint together. Both refuse a position
// above the store's head with a [*CheckpointAboveHeadError].
// [Store.ResetCheckpoint] is the operator's way back.
//
// # Failover
//
// A store records the [ServerIdentity] of its primary (system identifier
// and timeline), read by every sequencer step, every notifier connection
// and [Store.CheckServer]. A promoted standby is a new timeline, and may
// hand out again the positions of commits it lacks: a change, or a head
// below a position the process saw ([Store.SawPosition]), is a
// [ServerChange] in [Store.Server], whose Changed channel closes. The
// sequencer then drops its watermark candidate, the notifier its latest
// values. [Store.ServerFence] refuses a write begun on another server
// ([*ServerChangedError]), looking at the write's own connection. A
// [ReadReplica] refuses a read pool that is not a standby of
// the primary ([ErrReplicaMismatch]). See docs/design/eventsource.md,
// "Failover".
//
// # Dead letters
//
// [Store.AddDeadLetter] records an event a subscription gave up on, with
// reason and attempts; [Store.DeadLetters] and [Store.DeadLetter] read them;
// [Store.ReplayDeadLetters] hands their events to a handler again and marks
// them replayed, without ever touching the subscription's checkpoint, and
// without holding a row lock while the handler runs.
//
// # Parked streams
//
// [Store.ParkStream] records a dead letter and parks its stream in one
// fenced transaction: the stream's later events wait, in the store, in
// order, for one row and no copy of them. [Store.ParkedStreams] lists them
// (per bucket of a generation, with how many events wait), an operator's
// [Store.RequestRelease] asks for a replay, a discard or a skip, and the
// bucket's reader carries a release out with fenced [Store.ReleaseParked]
// steps. See docs/design/parking.md.
//
// # Notifications
//
// After each batch the sequencer NOTIFYs [Store.NotifyChannel] with the new
// head position. A [Notifier] keeps one dedicated LISTEN connection per
// process for any number of channels, which [Notifier.Listen] adds while it
// runs (each lease store adds its rebalance channel), wakes
// each [Listener] through a channel of capacity 1 (bursts coalesce),
// reconnects with exponential backoff and jitter after a lost connection
// (a restarted server included), and runs a safety poll ([Probe]) so that a
// lost notification only delays a reader.
//
// # Schema and migrations
//
// All tables live in the configured schema (default "kumi"); every
// identifier is quoted, so any name PostgreSQL accepts is safe, a hostile
// one included, up to 63 bytes (PostgreSQL cuts longer ones). Migrations
// are embedded SQL files, applied in order, each in a transaction with its
// version, under an advisory lock: [Migrate] is idempotent and safe when
// several processes start at once, and tells an old binary to upgrade
// before it tries any DDL.
package eventsource
