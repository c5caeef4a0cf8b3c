package jobs

import (
	"strings"

	"github.com/jobkeys/jobkeys/internal/boundedmap"
)

// natsJobCacheMax bounds the jobs a NATSStore remembers.
const natsJobCacheMax = 4096

// natsJobCache remembers the running jobs this store wrote last (claimed,
// renewed, progressed), and the pending jobs a worker read to claim
// (peekJob), with their entry revisions, so that the next call on one of
// them can apply its rule and write without reading first. An entry is only a guess: the write presents the remembered
// revision, so a job that changed since fails the compare-and-swap and the
// call reads it and goes on as without the cache; a rule that refuses the
// remembered job is tried again on the stored one. It is safe for
// concurrent use.
type natsJobCache struct {
	entries boundedmap.Map[string, natsCached] // Max: natsJobCacheMax, set by NewNATSStore
}

type natsCached struct {
	job       Job // a private copy
	rev       uint64
	activeSeq uint64
	// marks and target: the marks of a record an unbatched enqueue
	// marked, and the target they were resolved against (see
	// natsstore_enqueue.go).
	marks  natsMarks
	target natsTargetRead
}

func (c *natsJobCache) put(key string, j Job, rev, activeSeq uint64) {
	c.putEntry(key, natsCached{job: j, rev: rev, activeSeq: activeSeq})
}

// putEntry remembers e (its job copied) under key.
func (c *natsJobCache) putEntry(key string, e natsCached) {
	e.job = cloneJob(e.job)
	c.entries.Put(key, e) // evicts an arbitrary entry when full
}

// get returns a copy of key's entry.
func (c *natsJobCache) get(key string) (natsCached, bool) {
	e, ok := c.entries.Get(key)
	if ok {
		e.job = cloneJob(e.job)
	}
	return e, ok
}

func (c *natsJobCache) drop(key string) { c.entries.Delete(key) }

// natsKeySet is a set of KV keys of a bounded size (natsJobCacheMax, or
// natsPendingHintsMax for the pending set); adding to a full set evicts an
// arbitrary key. The store keeps two: the
// targets it has seen stored (an enqueue for a target it has not seen
// first tries the batch that assumes the idempotency key, the job id and
// the target are all new: one round trip instead of a read and a write; a
// wrong guess fails the batch whole and costs that round trip before the
// enqueue reads), and the jobs it enqueued and has not yet seen claimed or
// finished (a claim reads their records in the same request as the active
// index; whatever the index names beyond them is read after). Both are
// guesses. It is safe for concurrent use.
type natsKeySet struct {
	keys boundedmap.Map[string, struct{}] // Max: set by NewNATSStore
}

// natsPendingHintsMax bounds the job keys the pending set holds, and
// natsPendingPrefetch how many a claim reads ahead.
const (
	natsPendingHintsMax = 1024
	natsPendingPrefetch = 32
)

func (h *natsKeySet) has(key string) bool {
	_, ok := h.keys.Get(key)
	return ok
}

func (h *natsKeySet) add(key string) { h.keys.Put(key, struct{}{}) }

func (h *natsKeySet) remove(key string) { h.keys.Delete(key) }

// matching returns up to natsPendingPrefetch keys with the given prefix.
func (h *natsKeySet) matching(prefix string) []string {
	var out []string
	h.keys.Range(func(k string, _ struct{}) bool {
		if len(out) == natsPendingPrefetch {
			return false
		}
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
		return true
	})
	return out
}

// natsListCacheChannels bounds the channels whose listing a store keeps,
// natsListCacheJobs the jobs of one kept listing.
const (
	natsListCacheChannels = 8
	natsListCacheJobs     = 200000
)

// natsListCache keeps the sorted list entries of the channels this store
// listed last, each with the sequence of the channel's last list entry when
// it was read. List entries are only ever added (with a later sequence) or
// purged with their channel, so while that sequence is unchanged the
// listing is too. It is safe for concurrent use.
type natsListCache struct {
	channels boundedmap.Map[string, natsListing] // Max: natsListCacheChannels, set by NewNATSStore
}

type natsListing struct {
	last uint64
	refs []*Job // ID and CreatedAt only, in list order; never modified
}

func (c *natsListCache) get(channelID string, last uint64) ([]*Job, bool) {
	l, ok := c.channels.Get(channelID)
	if !ok || l.last != last {
		return nil, false
	}
	return l.refs, true
}

func (c *natsListCache) put(channelID string, last uint64, refs []*Job) {
	if len(refs) > natsListCacheJobs {
		return
	}
	c.channels.Put(channelID, natsListing{last: last, refs: refs}) // evicts an arbitrary channel when full
}

// clear forgets every listing.
func (c *natsListCache) clear() { c.channels.Clear() }
