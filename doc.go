// Package jobkeys gives worker services keyed job concurrency over NATS
// JetStream KV: per key (a tenant, a document, an account) at most N jobs run
// and at most M more wait; a full queue rejects, coalesces into the existing
// job, or replaces the oldest waiting job; running jobs hold leases renewed
// by heartbeats, and a crashed worker's slot is taken over.
//
// Every change is a compare-and-swap on one KV key, so any number of
// processes on any number of machines coordinate through the NATS server or
// cluster they already run. The state is wire-compatible with the
// TypeScript original (bucket JOBS_KEYS_<service>, key
// <service>.<jobType>.<keyHash>, the same state JSON): Go and TS workers can
// share a bucket.
//
// # Quick start
//
// A [Policy] says how a job type is keyed and limited; a [KeyCoordinator]
// applies it over a [Store] ([NATSStore] in production, [MemoryStore] in
// tests and single processes):
//
//	store, err := jobkeys.NewNATSStore(js, jobkeys.WithCreateBuckets(jetstream.FileStorage, 1))
//	coord, err := jobkeys.NewCoordinator(store, nil)
//	policy := jobkeys.Policy{Key: []string{"tenant", "/tenant"}, MaxActive: 2, MaxQueuedPerKey: 10}
//
//	adm, err := coord.Admit(ctx, jobkeys.AdmitRequest{
//		Service: "billing", JobType: "sync", JobID: id, Payload: payload, Policy: policy})
//	// adm.Kind: accepted, rejected, coalesced or replaced
//
//	acq, err := coord.Acquire(ctx, jobkeys.AcquireRequest{
//		Service: "billing", JobType: "sync", JobID: id, Payload: payload, Policy: policy})
//	if acq.Kind == jobkeys.KindAcquired {
//		// run the job, calling coord.Renew every policy.HeartbeatInterval
//		_, err = coord.Release(ctx, jobkeys.ReleaseRequest{Lease: acq.Lease})
//	}
//
// # Keys
//
// [Policy.Key] is a template of literal segments and RFC 6901 JSON pointers
// into the job payload. [DeriveKey] turns it into a display key ("tenant:acme"),
// a key hash (SHA-256 of the segments as JavaScript's JSON.stringify writes
// them) and the KV key. Pointers must resolve to a string, a finite number or
// a boolean.
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
// # Reducers
//
// The rules live in pure functions — [ReduceAdmission], [ReduceAcquire],
// [ReduceRenew], [ReduceRelease], [ReduceRemoveQueued],
// [ReduceRestoreReplaced] — that take the state, the request, the policy,
// the time and the new slot token and return an outcome, with no clock,
// randomness or I/O. The coordinator wraps them in read → reduce →
// compare-and-swap, deleting a key's state when it becomes empty.
//
// # Workers
//
// A [Runner] is the worker loop most users want: [Runner.Run] acquires a
// slot (waiting without polling through a [Watcher], which holds one KV
// watch per service and fans changes out in memory), runs the handler with a
// context that is cancelled with [ErrLeaseLost] when the lease is lost,
// renews the lease every HeartbeatInterval, and releases the slot on every
// exit, panics included. [Runner.TryRun] hands a blocked job back as a
// [*BlockedError] instead, for consumers that would rather NakWithDelay. A
// [Sweeper] removes the expired slots of crashed workers from keys nobody
// asks for. See examples/worker.
//
// # Concurrency
//
// [KeyCoordinator], [NATSStore] and [MemoryStore] are safe for concurrent use.
// A coordinator remembers the last state and revision it read or wrote per
// key, so an uncontended admit → acquire → release cycle costs three writes
// and no reads; a stale memory only costs a failed compare-and-swap and a
// read.
package jobkeys
