// Package jobkeys gives worker services keyed job concurrency over NATS
// JetStream KV: per key (a tenant, a document, an account) at most N jobs run
// and at most M more wait; a full queue rejects, coalesces into the existing
// job, or replaces the oldest waiting job; running jobs hold leases renewed
// by heartbeats, and a crashed worker's slot is taken over.
//
// Every change is a compare-and-swap on one KV key, so any number of
// processes on any number of machines coordinate through the NATS server or
// cluster they already run: no extra service, no leader.
//
// # Where to start
//
// Most programs start from package [github.com/jobkeys/jobkeys/jobs]: its
// Client keeps a durable record of every job, enqueues it under its key's
// policy, runs registered kinds within the keys' limits, retries with
// backoff and cleans up after crashed processes (go run ./examples/quickstart).
//
// Use this package alone when the jobs already live somewhere of your own
// (a JetStream stream, a database, a TypeScript service sharing the keys)
// and only their per-key limits are wanted:
//
//   - [KeyCoordinator.JobType] binds a service, a job type and a [Policy]
//     once; its [JobType] admits, acquires, renews and releases jobs.
//   - [Runner] is the worker loop around a JobType (acquire, heartbeat,
//     release on every exit), with a [Watcher] to wait for a busy key
//     without polling it; [Sweeper] clears the slots of crashed workers
//     (go run ./examples/worker).
//   - [JobType.InspectKeys], [KeyCoordinator.WatchOccupancy],
//     [KeyCoordinator.Repair] and [KeyCoordinator.RemoveQueuedEntry] are the
//     operator's calls, and the cmd/jobkeys CLI's.
//
// # Quick start
//
// A [Policy] says how a job type is keyed and limited. A [KeyCoordinator]
// applies policies over a [Store] ([NATSStore] in production, [MemoryStore]
// in tests and single processes); bind each job type once with
// [KeyCoordinator.JobType] and call the handle with just the job:
//
//	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.FileStorage, 1))
//	coord, err := jobkeys.NewCoordinator(store, nil)
//	jt, err := coord.JobType("billing", "sync", jobkeys.Policy{
//		Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 10})
//
//	adm, err := jt.Admit(ctx, id, payload)
//	// adm.Kind: accepted, rejected, coalesced or replaced
//
//	acq, err := jt.Acquire(ctx, id, payload)
//	if acq.Kind == jobkeys.KindAcquired {
//		// run the job, calling jt.Renew(ctx, acq.Lease) every HeartbeatInterval
//		_, err = jt.Release(ctx, acq.Lease)
//	}
//
// Most workers use a [Runner] instead of Acquire, Renew and Release (see
// Workers below). The request-struct methods of [KeyCoordinator] (Admit with
// an [AdmitRequest], and so on) do the same for callers that carry the
// service, job type and policy with every request.
//
// # Keys
//
// [Policy.Key] is a template of literal segments and RFC 6901 JSON pointers
// into the job payload. [DeriveKey] (or [JobType.Key]) turns it into a
// display key ("tenant:acme"), a key hash (SHA-256 of the segments) and the
// KV key <service>.<jobType>.<keyHash> in the bucket JOBS_KEYS_<service>.
// Pointers must resolve to a string, a finite number or a boolean. A
// payload is JSON text as a []byte (or [encoding/json.RawMessage]), or a
// value encoding/json marshals: a Go string is marshaled as a JSON string,
// so pass JSON text as []byte.
//
// # Outcomes and errors
//
// Business outcomes are values with a [Kind] (and a [Reason] where one
// applies): a rejected admission or a blocked acquisition is not an error.
// Errors are for bad input ([ErrInvalidPolicy], [ErrInvalidName],
// [ErrInvalidKey], [ErrInvalidRequest]), unusable stored state
// ([ErrCorruptState], [ErrForeignState], [ErrStateTooLarge], reported as a
// [StateError] naming the KV key; the stored value is never overwritten),
// exhausted compare-and-swap retries ([ErrContention]), and I/O.
//
// # Workers
//
// A [Runner] is the worker loop most users want: [Runner.Run] acquires a
// slot (waiting without polling when [RunnerConfig].Watcher is set: a
// [Watcher] holds one KV watch per service and fans changes out in memory;
// without one it re-checks every RecheckInterval), runs the handler with a
// context that is cancelled with [ErrLeaseLost] when the lease is lost,
// renews the lease every HeartbeatInterval, and releases the slot on every
// exit, panics included. [Runner.TryRun] hands a blocked job back as a
// [*BlockedError] instead, for consumers that would rather NakWithDelay. A
// [Sweeper] runs [JobType.Sweep] now and then, removing the expired slots of
// crashed workers from keys nobody asks for; [WithSweepMargin] makes it keep
// slots expired less than a margin ago, for hosts whose clocks may run ahead
// of the workers'. See examples/worker.
//
// # Options: which to use when
//
//   - [WithCreateBuckets] on [NewNATSStore] when the program may create the
//     buckets it uses (and allow atomic publish on them); without it a
//     bucket must exist, and a call on a missing one fails with
//     [ErrBucketNotFound] naming it. [WithBucketPrefix] to name buckets
//     <prefix>_<service> instead of JOBS_KEYS_<service> (the TypeScript
//     original's names: keep them to share buckets with it).
//   - [WithWakeUps] when many processes wait on the same keys: a write
//     that frees slots then wakes only the next queued jobs, on core NATS
//     subjects of their own, instead of every process's watch seeing every
//     change. Turn it on in every process's store (a writer without it
//     sends no wake-ups, and waiters fall back to their recheck). Within
//     one process the watch does about as well: it pays where processes
//     share keys. A release's wake-up is published before Release
//     returns, so a worker may close its connection right after.
//     A [Runner] waits for the wake-ups of its own job by itself; the
//     jobs Client dispatches jobs when their key has room instead of
//     waiting on keys.
//   - [WithStrictCreate] (never coalesce or replace), [WithRetry] (see
//     Retries), [WithTries], [WithInstanceID] and [WithTraceContext] per
//     call; [Config] and [RunnerConfig] for the rest, each field with its
//     default.
//
// Group commit needs no option: a coordinator's operations queued on one
// key are written together (a blocked acquisition completes on the write
// ahead of it without a read), and where the bucket allows atomic publish
// (see [NATSStore], "Atomic batches") the states of several go to the
// server in one round trip, each still a revision of its own. The
// outcomes and the wire are those of one operation at a time.
//
// # Retries
//
// [WithRetry] lets a job that is not queued take a slot, for a job that ran
// before, failed and released its slot. The coordinator cannot check that
// claim, and a JetStream delivery count cannot either: NumDelivered > 1 is
// also what these look like, and the recipe "WithRetry when NumDelivered > 1"
// runs or loses them:
//
//   - A redelivery after AckWait while the first worker is alive but frozen
//     (a long pause, a partition). The retry waits for the frozen worker's
//     lease to expire and then takes its slot over; the frozen worker learns
//     it lost the lease only at its next renewal, so both may have worked on
//     the job, and the frozen worker's ack or nak of its older delivery
//     counts for nothing.
//   - A redelivery of a job that is over: replaced by a newer job
//     ([ReplaceOldest]), removed ([JobType.RemoveQueued]), done but its ack
//     was lost, or failed because its worker stopped renewing (a stale slot
//     reported in RunResult.Stale or a [SweepReport]). As a retry it runs
//     again.
//   - A message that runs out of deliveries (MaxDeliver, naks of busy keys
//     count) while its job is queued: the job never runs, and its queue entry
//     keeps a place until it is removed.
//
// The jobs Client decides these from its job records. With this package
// alone, decide them as it does: record how each job ended (done, failed, replaced, removed, stale) in a store you own,
// keyed by job id, before you ack or terminate its message, and look it up
// before you acquire a redelivered message: a job with an end is acked
// without running, and only a job without one is run [WithRetry]. Keep a live
// worker's message from being redelivered with AckWait well above
// HeartbeatTTL and msg.InProgress() while the handler runs. Make handlers
// idempotent, since delivery is at least once, and let a handler whose
// context ends with [ErrLeaseLost] stop before its side effects.
// examples/worker does all of this.
//
// # Clocks
//
// Leases are timestamps written by one host and compared by others. Mutual
// exclusion holds while the clocks of the hosts sharing a bucket differ by
// less than HeartbeatTTL − HeartbeatInterval: a host whose clock runs ahead
// by more sees live leases as expired and takes their slots over. Keep
// clocks synchronised (NTP) and that margin wide. A [Runner] counts its own
// lease's time on the local monotonic clock, so a clock step on its own host
// does not change when it gives its lease up as lost.
//
// # Reducers
//
// The rules live in pure functions ([ReduceAdmission], [ReduceAcquire],
// [ReduceRenew], [ReduceRelease], [ReduceRemoveQueued],
// [ReduceRestoreReplaced], [ReduceSweep]) that take the state, the request,
// the policy, the time and the new slot token and return an outcome, with no
// clock, randomness or I/O. The coordinator wraps them in read → reduce →
// compare-and-swap, deleting a key's state when it becomes empty.
//
// # Stores
//
// A coordinator works over a [Store]: four compare-and-swap calls on one
// KV key. [NATSStore] (one KV bucket per service) is the one to run;
// [MemoryStore] is for tests. A store may have optional capabilities,
// found by type assertion: two make the coordinator cheaper without
// changing an outcome, [BatchWriter] (a lane's writes as one atomic batch)
// and [ValueWatcher] (a Watcher that needs no reads); two add checks,
// [ValueLimiter] (room for a queued job's slot checked at admission) and
// [ClockSource] (clock skew detection); [ListableStore] is needed by a
// [Sweeper]. Package
// [github.com/jobkeys/jobkeys/keystoretest] checks a store against the
// contract of Store and of each capability it has.
//
// # Concurrency
//
// [KeyCoordinator], [JobType], [Runner], [Watcher], [Sweeper], [NATSStore]
// and [MemoryStore] are safe for concurrent use. A coordinator remembers the
// last state and revision it read or wrote per key, so an uncontended admit
// → acquire → release cycle costs three writes and no reads; a stale memory
// only costs a failed compare-and-swap and a read.
//
// # Wire compatibility
//
// The bucket and key names, the key hash and the state JSON are those of the
// TypeScript implementation this package comes from, so Go and TypeScript
// workers can share a bucket.
//
// # Metrics and logs
//
// [Config.MeterProvider] takes an OpenTelemetry MeterProvider: the
// coordinator, its job types' sweeps and the Runners of its job types then report
// operations by kind and outcome, their latency, compare-and-swap
// conflicts and exhausted retries, and running and waiting jobs, with no
// per-key or per-job attribute (meter [MeterName]; the README lists every
// instrument). [Config.Logger] and [RunnerConfig.Logger] take a
// [log/slog.Logger] for unusable state, stale takeovers, sweeps, failed
// renewals and lost leases. Both default to nil: no metrics, no logs, no
// cost. A job's trace context comes from the caller's span when ctx
// carries one (see [WithTraceContext]).
package jobkeys
