// Package keycache is what a coordinator knows of one KV key's stored
// state: the last state and revision it saw stored (read, written, or
// delivered by a watch feed), the key's backoff window, the marks of its
// watch feed, the hints of wake-ups from other processes and its own
// recent writes. The engine it belongs to is described in
// docs/design/keys-engine.md ("Key entry", "Guess", "Backoff window",
// "Watch feed", "Hint").
//
// # What it never does
//
// It never looks inside a state. An [Entry] holds a *T it is given and
// hands it back; it orders states by their revisions only. The one place
// it needs a state's contents is a value a watch feed delivered without
// decoding it ([Entry.WatchedValue]): the entry keeps the bytes and calls
// its [Entry.Decode] when an operation needs the state, which also says
// whether the value is that key's state at all. What a state allows (free
// slots, queues, leases) is the caller's business.
//
// It does no I/O: reads and writes are made by the caller, which reports
// them ([Entry.Begin], [Entry.Observe], [Entry.Commit], [Entry.ConflictAt]).
// The only waits are [Entry.AwaitChange] and [Entry.AwaitCreated] (for a
// watch feed's next delivery) and [SleepJitter] (a paced first attempt),
// each bounded and ended by its context.
//
// # Concepts
//
//   - Known state: the state and revision the coordinator last saw stored,
//     immutable once stored (the entry and its callers share it).
//   - Guess ([Start] from [Entry.Begin] without a read): the known state an
//     attempt starts from without a read. A write on it is a
//     compare-and-swap; an outcome that writes nothing may rest only on a
//     verified state ([Start.Verified]).
//   - Watch feed ([Entry.Attach], [Entry.Watched]): while a watch of the
//     key feeds the entry, a state the feed vouches for (delivered, or
//     read or written since, with no change missed) is trusted; a lost race
//     on it waits for the feed's next delivery instead of a read.
//   - Hint ([Entry.Hinted]): a wake-up's revision, vouched for by nobody:
//     the next attempt reads before it writes.
//   - Backoff window ([Entry.Lose], [Entry.PaceWindow]): doubles with each
//     race lost on the key, halves with each commit, paces first attempts
//     while the key is contended.
//   - Send time ([Entry.Learned]): when the request that returned the known
//     state was sent; every later write of the key was committed after it.
//
// # Why it is kept
//
// It saves reads and lost races (BENCHMARKS.md, rows cited as they stand):
//
//   - "Uncontended cycle", `Cycle/NATS/1worker`: 3 round trips per cycle
//     against `RawKV/1worker`'s 6, because acquire and release write on
//     the state and revision the entry remembers from the coordinator's
//     own last write instead of reading it first.
//   - "Hot keys in one process", 16 workers on one connection: 0–0.01
//     reads per cycle, because the Watcher's feed keeps the entry trusted
//     and waiting reads nothing.
//   - "Contended keys", `16workers-1key-max4`: 0.12 stale guesses per
//     operation, the price of writing on a remembered state (one failed
//     write and a read each), beside 0.25 lost races.
//
// # Concurrency
//
// An [Entry]'s methods are safe for concurrent use. The lane (one writer
// per key) is the caller's: methods whose doc says the caller holds the
// lane assume no other write of the key is under way through this entry.
package keycache
