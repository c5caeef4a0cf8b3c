// Package wake carries the key layer's targeted wake-ups over core NATS:
// a write that leaves slots of a key free sends the state it wrote to the
// subjects of the first queued jobs, where those jobs' blocked Runs wait,
// instead of every waiter of the key learning of the change from a KV
// watch and reading the key. A [Hub] is one store's side of it: the
// waiters of its process, the delivery of the wake-ups it publishes, and
// its counters. It knows subjects, bytes, revisions and job ids; what a
// state means (which slots it frees, which jobs it queues) is the key
// layer's (package jobkeys: wake.go), and so is the
// store wiring (natskv_wake.go: WithWakeUps, the capability methods).
//
// The whole protocol (trust by age and by send time, queue turn and
// wake-ahead, and why no wake-up is lost) is described
// in docs/design/keys-engine.md; this package holds the part below.
//
// # Messages and subjects
//
//   - Wake-up: subject "<prefix>.<bucket>.<kvKey>.<token>" ([Hub.Subject]),
//     token the unpadded base64url of the first 16 bytes of SHA-256 of the
//     job id ([Token]); payload the state's revision (8 bytes, big-endian)
//     followed by its value exactly as stored in KV; a reply subject under
//     the connection's inbox prefix, "<inbox>.<chain id>", one reply
//     subscription per hub made on first use. The prefix is the store's
//     (by default "jobkeys.wake"; [ValidatePrefix]:
//     dot-separated tokens of letters, digits, '_' and '-', at most
//     [PrefixMaxLength] bytes), and must not overlap the connection's
//     inboxes or the JetStream API's subjects ([Config].Reserved), so
//     that the refusal of a wake-up subject is never taken for a call's.
//   - "No responders": the server's answer (Status 503, header
//     Nats-Subject naming the target's subject) to a wake-up that found no
//     subscription. A hub that receives a wake-up none of whose waiters
//     takes it any more (each stopped while its UNSUB was on its way)
//     answers the same (answerNoWaiter).
//   - Local delivery: a target waiting on the publishing hub itself is
//     handed the wake-up in memory, with the value as stored, and nothing
//     is published.
//   - PING/PONG: a subject's first waiter returns from [Hub.Subscribe]
//     once the server confirmed its SUB (a flush), or after
//     [Config].Confirm without that.
//
// A wake-up from the network is a hint: anyone allowed to publish on the
// subjects can send any revision and any state, so a waiter is handed
// only its revision (value nil), never a state to write on.
//
// # The walk, the resend chain and expiry
//
// [Hub.Publish] makes a chain: the targets (job ids in queue order, at
// most free + [WalkExtra]) walked one at a time while fewer than free are
// delivered in memory or awaiting an answer; a "no responders" answer
// moves it on to the next target. When nothing is in flight and nobody
// was woken at all, the chain is sent again from its first target after
// [Retry], and once more [RetryLate] after that ([Resends]): a waiter that
// had just blocked may not be subscribed yet. A newer revision of the key
// published meanwhile ends the older chain (its resend and its answers
// move nothing); an older revision than one already published is not
// sent. A wake-up sent again for the same revision ("again", a Run blocked
// in turn) waits for the retry of a chain that found nobody in its stead,
// and is not sent a second time to the jobs ahead a chain of that
// revision still has in flight (coveredLocked). Delivery state is kept
// [ChainTTL] at most, and for at most 4,096 chains and 8 MiB of states,
// the oldest dropped first; it is forgotten lazily, by the next Publish.
// The last waiter's stop drains its subscription rather than
// unsubscribing at once, so that a wake-up the server delivered before
// the UNSUB reaches the dispatcher and is answered "no responders".
//
// # Timings
//
//	Retry, RetryLate, Resends  2 ms, 8 ms, 2   a waiter that just blocked may not be subscribed yet
//	Config.Confirm             Retry + RetryLate - 100 µs, as the key layer passes it (its wakeTrustSent)
//	ChainTTL                   1 s             a "no responders" answer comes within a round trip
//	WalkExtra                  64              targets tried past the free slots
//	chains, states kept        4,096, 8 MiB    memory bounds of the delivery state
//	dispatcher buffer          1,024 messages
//
// # Hooks
//
// The hub does not own the connection's error handler, where the server's
// permission refusals arrive; the store counts the refusals of the hub's
// subjects there and passes the count in as [Config].Refused, which
// [Hub.Counters] reports.
//
// # What it earns
//
// From BENCHMARKS.md, "Hot keys across processes", loopback column (one
// hot key, MaxActive 1, each figure as a share of one worker's cycle
// rate): 16 workers on 16 connections run at 0.34–0.39× over wake-ups
// (K11) and at 0.14–0.16× when every process watches the key instead
// (K13); 64 workers on 64 connections at 0.19–0.21× against
// 0.019–0.021×. Run in the repository root:
//
//	go test -run '^$' -benchtime 5s \
//	  -bench 'BenchmarkCycle/NATS/(1worker$|16workers-16conns-1key-wake$|64workers-16conns-1key-wake$|64workers-4conns-1key-wake$|64workers-64conns-1key-wake$)' .
//	go test -run '^$' -benchtime 2s -benchmem \
//	  -bench 'BenchmarkCycle/NATS/(1worker$|16workers-16conns-1key-(watcher|wake)$|64workers-4conns-1key-(watcher|wake)$|64workers-64conns-1key-(watcher|wake)$)|BenchmarkCycleProcs' .
//
// The same file's "ceiling" rows (BenchmarkCeiling, the protocols in bare
// nats.go) put a cycle's CPU at 222 µs over targeted wake-ups against
// 1,620 µs when every one of 16 connections watches the key.
//
// # Tests
//
// The hub's own behaviour is tested here against an embedded nats-server
// (hub_test.go: wire, walk, resends, staleness, stop, bounds; resend_test.go:
// wake-ups sent again and wake-ups handed to nobody); the protocol through
// KeyCoordinator and Runner is tested in the root package (wake_*_test.go,
// system_wake_soak_test.go).
package wake
