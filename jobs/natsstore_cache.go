package jobs

import (
	"strings"
	"sync"
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
	mu      sync.Mutex
	entries map[string]natsCached
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
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = make(map[string]natsCached)
	}
	if _, ok := c.entries[key]; !ok && len(c.entries) >= natsJobCacheMax {
		for victim := range c.entries { // evict an arbitrary entry
			delete(c.entries, victim)
			break
		}
	}
	e.job = cloneJob(e.job)
	c.entries[key] = e
}

// get returns a copy of key's entry.
func (c *natsJobCache) get(key string) (natsCached, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.entries[key]
	if ok {
		e.job = cloneJob(e.job)
	}
	return e, ok
}

func (c *natsJobCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// natsKeySet is a set of KV keys of at most max entries (0: natsJobCacheMax);
// adding to a full set evicts an arbitrary key. The store keeps two: the
// targets it has seen stored (an enqueue for a target it has not seen
// first tries the batch that assumes the idempotency key, the job id and
// the target are all new: one round trip instead of a read and a write; a
// wrong guess fails the batch whole and costs that round trip before the
// enqueue reads), and the jobs it enqueued and has not yet seen claimed or
// finished (a claim reads their records in the same request as the active
// index; whatever the index names beyond them is read after). Both are
// guesses. It is safe for concurrent use.
type natsKeySet struct {
	mu   sync.Mutex
	max  int
	keys map[string]struct{}
}

// natsPendingHintsMax bounds the job keys the pending set holds, and
// natsPendingPrefetch how many a claim reads ahead.
const (
	natsPendingHintsMax = 1024
	natsPendingPrefetch = 32
)

func (h *natsKeySet) has(key string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.keys[key]
	return ok
}

func (h *natsKeySet) add(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.keys == nil {
		h.keys = make(map[string]struct{})
	}
	most := h.max
	if most == 0 {
		most = natsJobCacheMax
	}
	if _, ok := h.keys[key]; !ok && len(h.keys) >= most {
		for victim := range h.keys {
			delete(h.keys, victim)
			break
		}
	}
	h.keys[key] = struct{}{}
}

func (h *natsKeySet) remove(key string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.keys, key)
}

// matching returns up to natsPendingPrefetch keys with the given prefix.
func (h *natsKeySet) matching(prefix string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for k := range h.keys {
		if len(out) == natsPendingPrefetch {
			break
		}
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
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
	mu       sync.Mutex
	channels map[string]natsListing
}

type natsListing struct {
	last uint64
	refs []*Job // ID and CreatedAt only, in list order; never modified
}

func (c *natsListCache) get(channelID string, last uint64) ([]*Job, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.channels[channelID]
	if !ok || l.last != last {
		return nil, false
	}
	return l.refs, true
}

func (c *natsListCache) put(channelID string, last uint64, refs []*Job) {
	if len(refs) > natsListCacheJobs {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.channels == nil {
		c.channels = make(map[string]natsListing)
	}
	if _, ok := c.channels[channelID]; !ok && len(c.channels) >= natsListCacheChannels {
		for victim := range c.channels {
			delete(c.channels, victim)
			break
		}
	}
	c.channels[channelID] = natsListing{last: last, refs: refs}
}
