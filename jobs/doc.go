// Package jobs is the durable half of a job system: job records with a
// lifecycle, kept in memory ([MemoryStore]) or in one NATS JetStream KV
// bucket ([NATSStore]), both behind the [Store] interface and proven by one
// conformance suite (package jobstest) — and the runtime that joins them to
// the key layer: a [Client] enqueues a job as a record plus a keyed
// admission, runs registered kinds ([Register], [Kind]) under their keys'
// limits, renews claim and slot together, settles or retries with backoff
// up to a failure budget, reconciles what crashed processes left behind and
// drains on [Client.Stop]. Most programs use the Client; the Store is the
// layer beneath it. See ExampleNewNATSClient, ExampleClient and
// examples/quickstart.
//
// # Quick start: the runtime
//
//	client, err := jobs.NewNATSClient(js, &jobs.ClientConfig{MaxWorkers: 8}) // both buckets, the coordinator inside
//	err = jobs.Register(client, jobs.Kind[In, Out]{Type: "render",
//		Policy: jobkeys.Policy{Key: []string{"doc", "/docId"}, MaxActive: 1},
//		MaxFailures: 5, Timeout: time.Minute, Work: render}) // a producer leaves Work nil
//	res, err := client.Enqueue(ctx, jobs.EnqueueRequest{Type: "render", Input: in}) // accepted, coalesced, replaced, or a *RejectedError
//	results := client.EnqueueMany(ctx, reqs) // one BatchResult per request
//	job, err := client.Retry(ctx, jobs.ChannelDefault, failedID) // a failed job runs again as a new job
//	err = client.Start(ctx)
//	defer client.Stop(ctx)
//
// [NewClient] takes stores of your own ([MemoryStore], a [NATSStore] made
// with options, a key store) and a coordinator instead.
//
// # The runtime
//
// [Client.Enqueue] writes the record and admits it on its key under the
// kind's [jobkeys.Policy]: the [EnqueueResult]'s Outcome is
// [OutcomeAccepted], [OutcomeCoalesced] (Job is the job already there) or
// [OutcomeReplaced] (Replaced, the job it pushed out of the queue, is
// superseded with reason "replaced"); a full key under jobkeys.Reject is a
// [*RejectedError] ([ErrRejected]) and leaves no pending record.
//
// After [Client.Start] the client's workers take the jobs dispatched to
// them (see Dispatch below: a job whose key is full waits in the key's
// queue, unclaimed, writing nothing), take each one's key slot and then
// its claim before its handler runs, and renew claim and slot together
// every HeartbeatInterval. The handler's context ends with a
// cause ([ErrClaimLost], [ErrSlotLost], [ErrPaused], [ErrCancelled],
// [ErrSuperseded], [ErrTimeout], [ErrStopping]): read it with
// context.Cause. It ends with ErrClaimLost at the claim's local deadline
// (see Claims and fencing) even when nothing could renew or end it: it
// checks that deadline itself whenever it is asked, so a process that
// wakes past it (stopped, paused) finds it ended before its handler can
// act. A nil error settles the job with the handler's result;
// an error (or the timeout) requeues it with ClientConfig.Backoff
// ([DefaultBackoff]: 1 s·2^(failures−1), at most 5 min) and fails it for
// good when its failures reach [Kind].MaxFailures. An error marked
// [Permanent] fails it at once; [Snooze] hands it back for a while
// without counting a failure. [Client.Cancel],
// [Client.Pause], [Client.Resume] and [Client.Supersede] are the control
// calls (a running job of the same client stops at once, of another at its
// next heartbeat). [Client.Reconcile] runs every ReconcileInterval in every
// started client (negative: never) and removes what crashed processes left
// behind: expired slots, and queue entries of finished or missing jobs,
// and announces again what a crash kept from being announced. [Client.Stop]
// drains: no new jobs taken, StopGrace for handlers, the rest handed back
// without a failure.
//
// A kind's keys are those of job type Kind.Type in the key-layer service
// ClientConfig.Service ("jobs" by default, so bucket JOBS_KEYS_jobs).
// ClientConfig.MaxWorkers bounds the handlers of one process.
//
// # Dispatch
//
// A job reaches a worker when it is due and its key has a free slot, and
// not before: jobs of a full key wait in the key's queue (the key layer's
// order), unclaimed, costing nothing. What moves them is an announcement,
// "job J may start", on the service's dispatch stream JOBS_DISPATCH_<Service>
// (a JetStream work-queue stream; in memory within one process for a
// MemoryStore): Enqueue announces a job admitted with a free slot for it;
// a release announces the next queued job (one per freed slot, to a
// worker of any process); a retry's announcement comes back at its due
// time; a resume announces the job. Every client of a service pulls from
// one consumer, one message per free worker, so an announcement goes to
// an idle worker of any process at once, and a process with no free
// worker holds none. Keys are served in the order their jobs became
// startable: a key with a thousand jobs queued has one announcement out
// at a time (MaxActive), so it delays another key's job by about one job.
//
// An announcement is a hint: the worker that takes it reads the job and
// takes the key's slot (a compare-and-swap) and then the job's claim
// ([Store.ClaimJob], a compare-and-swap fenced by claim generation); a
// duplicated, stale or forged announcement costs a read. A job that cannot
// start (paused, not due, its key full) is left to the announcement that
// will come when it can, and a room it cannot use is handed to the next
// queued job. A job never admitted (its producer died between the record
// and the admission) is admitted strictly after AdmitGrace, on an
// announcement its Enqueue made before writing the record; a retry whose
// key is full goes back to the head of the key's queue. While a job runs
// its announcement stays unacknowledged: a worker that dies leaves it to
// come back after the claim's TTL, and the next worker takes the expired
// claim over. Publishing on the dispatch subjects allows wasted reads, no
// write. docs/design/dispatch.md has the whole protocol.
//
// # Quick start: the store alone
//
//	store, err := jobs.NewMemoryStore(nil) // or jobs.NewNATSStore(js, nil, jobs.WithCreateBucket(jetstream.FileStorage, 1))
//	out, err := store.Enqueue(ctx, jobs.EnqueueRequest{
//		ID: id, ChannelID: "acme", Type: "render", Version: 1,
//		TargetKey: "doc-42", IdempotencyKey: "doc-42@v7", Fingerprint: hash,
//		Input: input})
//	claimed, err := store.Claim(ctx, jobs.ClaimRequest{Owner: "worker-1", Count: 10, TTL: time.Minute})
//	for _, job := range claimed {
//		claim := jobs.ClaimOf(job)
//		// work, calling store.Renew before the claim expires and
//		// store.AppendProgress as stages start and end, then:
//		_, err = store.Settle(ctx, jobs.SettleRequest{Claim: claim, Artifact: result})
//		// or store.Requeue (retry later) or store.Fail (give up)
//	}
//
// # Jobs, channels and targets
//
// A [Job] belongs to a channel (a tenant or workspace; [Config.Channels]
// says which exist and which are archived) and updates a target (a
// document, a report). Its id is unique in the channel. Every job of a
// target has a generation: the target's first job 1, the next 2, and so on.
// Enqueuing a job supersedes the target's older pending, paused and running
// jobs in the same change, and only a job of its target's current
// generation can be claimed or controlled: work on a stale version of a
// resource stops by itself.
//
// # Idempotency
//
// An enqueue names an idempotency key, unique in the channel, and a
// fingerprint of its content. Enqueuing a key again with the same
// fingerprint returns the job as it is now, with [Enqueued].Repeated set,
// and changes nothing; with another fingerprint it is [ErrConflict].
// [Store.DeleteChannel] forgets the keys: an identical enqueue afterwards
// makes a new job. So does a job's retention ([Retention]): once a
// finished job is deleted, an enqueue with its idempotency key makes a new
// job.
//
// # Retention, periodic jobs and listing
//
// A [Client] hands its [ClientConfig.Retention] to its store: finished
// jobs, with their entries, are deleted after it (24h for completed,
// cancelled and superseded jobs, 7 days for failed ones, by default); a
// NATSStore by per-message TTL, so the server does it. [ClientConfig.Periodic]
// enqueues a [Periodic] job on a schedule (Every or a five-field cron), one
// job per tick whatever the number of clients. [Store.List] filters by
// [ListRequest].States and Types, and lists every channel when ChannelID
// is empty.
//
// # States
//
// A job is pending until claimed, running while claimed, and ends
// completed ([Store.Settle]), failed ([Store.Fail]), cancelled or
// superseded. [Store.Requeue] makes a running job pending again (later,
// counting a failure if asked); operators [Store.Pause] a pending or
// running job, [Store.Resume] a paused one, [Store.Cancel] or
// [Store.Supersede] any active one. Pause, Resume and Supersede take the
// revision the operator saw (ExpectedRevision), so they never act on a job
// that changed meanwhile. Cancelling a job of an archived channel needs
// AllowArchived.
//
// # Claims and fencing
//
// [Store.Claim] takes up to ClaimCountLimit due jobs — pending ones whose
// AvailableAt has come and running ones whose claim expired — ordered by due
// time, creation time and id, from one channel or from all. A claim makes the
// job running with a new claim generation and an expiry of now+TTL. Every
// claimed call (Renew, Requeue, AppendProgress, Settle, Fail) presents the
// [Claim] and is refused with ErrConflict unless the job is still running
// under that owner and generation, the claim has not expired and the job
// is of its target's current generation: a worker whose claim expired and
// was taken over cannot write. [Store.Renew] also takes the revision the
// worker last saw and must move the expiry later; it can bind a small
// value (such as a key-layer lease) to the claim.
//
// A [Client] counts each claim (and each key slot) on its own monotonic
// clock: a claim made or renewed by a request that started at s is good
// until s + TTL − a margin (half the HeartbeatInterval, or half the gap
// between it and the TTL if less), its local deadline; the start, not the
// reply, since the store may have written it at any time in between. At
// that deadline the handler's context ends with [ErrClaimLost] (with
// [ErrSlotLost] at the slot's, if earlier) and the client writes nothing
// more for the claim: no progress, settle, failure or hand-back. The
// claim generation ([Run.Job]().ClaimGeneration) is the fencing token to
// hand to the systems a handler writes to: every claim of a job has a
// higher one than the claims before it, so a target that keeps the highest
// token it has seen can refuse the write of a handler whose claim was lost
// without its knowing (see the example of [Run.Job]).
//
// # Clocks
//
// Claims are timestamps of the host that wrote them, compared against the
// clock of whichever host claims next: as with the key layer's leases (see
// Clocks in [jobkeys.Policy]'s doc), hosts whose clocks differ by what is
// left of a claim when it is renewed can claim a job that still runs. A
// [Client] renews its claims at half their TTL (the longest HeartbeatTTL
// of its kinds) before they expire at the latest, or every
// HeartbeatInterval, and claims nothing while its coordinator
// ([jobkeys.KeyCoordinator.ClockOffset]) proves the host's clock half of
// that margin or more from the NATS server's: (TTL − max(TTL/2, the
// longest HeartbeatInterval)) / 2, 30s with the default policy: its
// workers take no announcement. It logs the refusal (a warning) and its
// end once each, looks again every PollInterval, and keeps renewing and
// settling the jobs it holds. A
// store that does not see the server's time (a [jobkeys.MemoryStore])
// proves nothing. The coordinator's jobkeys.Config.IgnoreClockSkew turns the
// check off for its clients too.
//
// Every time a store writes on a record is its own clock reading
// ([Config].Now) at that write, as in the seed: a transition neither
// refuses a clock that is behind the record's times nor moves its reading
// forward to meet them. So UpdatedAt can be before CreatedAt or before the
// UpdatedAt it replaced, and a progress entry can be older than the one
// before it; both stores write, read, list and claim such records (the
// validators check no order between times). Only [Store.Renew] and
// [Store.AppendProgress] refuse (ErrConflict) a clock before the job's
// UpdatedAt, the seed's rule. Times are not clamped to the latest one on
// the record because one writer whose clock was ahead, or one jump
// forward, would then block every later renewal and progress of the job
// until every clock had passed it; stamping the reading lets the next
// claim start afresh. TestClockOrderProperty drives every transition under
// random clocks (behind, ahead, jumps of years) against both stores and
// checks that every record stays readable and valid; the conformance
// suite's ClocksBehindTheRecord holds the seed's outcomes at fixed times.
//
// # Progress and artifacts
//
// Progress entries name a stage (^[a-z][a-z0-9-]{0,63}$), a label of 1 to
// LabelLimit characters and a [ProgressState]; an interrupted stage has a
// reason. As in the seed, a label is trimmed as JavaScript's trim does and
// its characters are UTF-16 code units (an emoji counts two; see
// [ProgressRequest].Label), and the entry is checked after the job is found
// and its claim fenced: a progress entry for a missing job is ErrNotFound,
// whatever the entry. A job keeps its last ProgressLimit entries. Settle
// stores the job's artifact once; it never changes after.
//
// # Revisions
//
// Every change in a channel raises the channel's revision, and every job a
// change touches carries it as its Revision; [Page] and [Detail] carry the
// channel's. Revisions only grow, but are not contiguous: in a NATSStore
// they are stream sequences, and jobs changed by one call may carry
// different ones. Compare them, never count them.
//
// # Errors and limits
//
// Errors wrap one of [ErrConflict], [ErrNotFound], [ErrCorrupt] and
// [ErrUnavailable] and say which field or job was wrong; a cancelled
// context's error is returned unchanged. A write whose answer did not
// come (a timeout, a lost connection, the caller's context ending after
// it was sent) may have been applied: its error wraps [ErrOutcomeUnknown]
// too (beside ErrUnavailable or the context's error); replay an enqueue
// so failed, and read the job after any other call. Requests are checked before
// anything is written: empty identifiers, bad JSON, and inputs, artifacts,
// bindings, identifiers and reasons over InputSizeLimit,
// ArtifactSizeLimit, BindingSizeLimit, IdentifierSizeLimit and
// ReasonSizeLimit are conflicts that name the limit. A stored record that
// does not validate is ErrCorrupt, naming the job (and the KV key), and is
// never overwritten. Claim skips such a record and claims the rest of the
// channel; it reports the skipped records (ErrCorrupt) only when it
// claimed nothing, so an error from Claim never comes with claimed jobs.
//
// # Differences from the seed
//
// The stores follow the job store seed's rules (its MemoryBackgroundJobStore
// and progress rule), in its order of checks, except for these deliberate
// differences; each names the test that holds it (the conformance suite's
// tests run as TestMemoryStoreConformance/… and TestNATSStoreConformance/…):
//
//   - Job ids are unique per channel; the seed's memory store checks them
//     across channels. (EnqueueIDsPerChannel)
//   - Revisions only grow; in a NATSStore they are stream sequences, not
//     contiguous, and jobs claimed by one call may carry different ones.
//     (RevisionsIncrease)
//   - JSON null given as an enqueue's Input, a renewal's Binding or a
//     settle's Artifact is no value: stored and handed back as nil, as an
//     empty one is. The seed keeps null as a value (only an undefined
//     binding is none); a json.RawMessage has no undefined to tell them
//     apart. (JSONNullIsNoValue)
//   - [Config].Guard runs before [Store.DeleteChannel] too: a store whose
//     writer lease is lost deletes nothing (ErrConflict). The seed's
//     deleteChannel asserts no lease. (GuardRefusesEveryWrite)
//   - Limits the seed does not have (identifier, reason, input, binding and
//     artifact sizes, UTF-8, times within years 1..9999) are checked
//     before anything else, so an oversized request for a missing job is
//     ErrConflict where the seed would say not found. (LimitsCheckedFirst)
//
// Where Go's own functions would differ from the seed's JavaScript, the
// stores match the seed: labels are trimmed by JavaScript's trim and
// counted in UTF-16 code units (ProgressLabelAsTheSeed,
// TestProgressLabelAsTheSeed); a progress entry is checked after its job is
// found and its claim fenced (ProgressFindsTheJobFirst); a transition
// stamps the store's clock even when it is behind the record's times
// (ClocksBehindTheRecord, TestClockOrderProperty).
//
// # Copies and concurrency
//
// Stores are safe for concurrent use; a NATSStore is safe across any
// number of processes. Every value a store returns is a copy, and the
// store keeps no reference to a request's slices.
//
// # Metrics and logs
//
// [Config.MeterProvider] takes an OpenTelemetry MeterProvider: both stores
// then count their transitions by outcome and job type, measure their
// latency, and report gauges of pending and running jobs by type (meter
// [MeterName]: jobkeys.jobs.transitions, jobkeys.jobs.duration,
// jobkeys.jobs.pending, jobkeys.jobs.running; the repository's README
// lists their attributes), with no per-key or per-job attribute. The
// gauges count the active jobs at each collection: a NATSStore reads the
// records of its pending and running jobs (never a finished one).
// [Config.Logger] logs corrupt records, and a [NATSStore]'s background
// purges the server refuses (once per store). Both default to nil: no
// metrics, no logs, no cost.
package jobs
