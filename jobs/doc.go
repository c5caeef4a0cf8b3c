// Package jobs is the durable half of a job system: job records with a
// lifecycle, kept in memory ([MemoryStore]) or in a NATS JetStream KV
// bucket ([NATSStore]), both behind the [Store] interface and proven by one
// conformance suite (package jobstest).
//
// A job is enqueued idempotently (an idempotency key per channel, a
// fingerprint that must match on replay) for a target; a newer job for the
// same target supersedes the older active ones. Workers claim due jobs in
// batches with a TTL, renew their claims, report bounded progress, and
// settle with an immutable artifact, requeue or fail; every claimed call is
// fenced by the claim's owner and generation, so a worker whose claim was
// reclaimed cannot write. Operators pause, resume, cancel and supersede
// jobs and list a channel's jobs with cursors.
package jobs
