package jobs

import (
	"context"
	"sync"
)

// EnqueueManyConcurrency is how many requests of one [Client.EnqueueMany]
// are in flight at once.
const EnqueueManyConcurrency = 32

// BatchResult is the outcome of one request of [Client.EnqueueMany]:
// Result and Err as [Client.Enqueue] would return them for it.
type BatchResult struct {
	// Result is the request's outcome; the zero value when Err is set.
	Result EnqueueResult
	// Err is the request's error, as Enqueue would return it (a
	// [*RejectedError], an error wrapping [ErrConflict],
	// [ErrUnknownKind], [ErrOutcomeUnknown], …); nil on success.
	Err error
}

// EnqueueMany enqueues reqs and returns one result per request, in their
// order: each request is applied as [Client.Enqueue] applies it (its
// defaults, the store's rules, its key's policy), and one that fails
// fails alone, the others going in. The ids it gives requests without
// one are made in slice order, so they sort in it.
//
// # Order
//
// Up to EnqueueManyConcurrency requests are in flight at once. Requests
// that can touch the same records are enqueued one after the other, in
// slice order: two requests are related when they share a channel and
// target, a channel and idempotency key, a channel and id, or a key of
// the key layer (derived from the request's input), and a request waits
// for every earlier request it is related to, directly or through other
// requests of the slice. The results of the batch are then those of a
// loop over the slice, with one exception: two unrelated requests may
// both touch a job enqueued before the batch — one supersedes it by
// target, the other replaces it on its key or coalesces into it — and
// then act on it in either order, as two concurrent Enqueue calls do
// (a replaced job ends superseded either way, with the reason, and in the
// result, of the request that came first). Related requests
// gain nothing from the batch: a batch whose requests all fall on one key
// (or one target) goes at the pace of a loop; requests spread over many
// keys go in parallel.
//
// When ctx ends, the requests not started get ctx's error (a request
// stopped after its record was written gets Enqueue's error, wrapping
// [ErrOutcomeUnknown]). It is safe for concurrent use, as Enqueue is; two
// concurrent calls are not ordered with each other.
func (c *Client) EnqueueMany(ctx context.Context, reqs []EnqueueRequest) []BatchResult {
	out := make([]BatchResult, len(reqs))
	done := make([]chan struct{}, len(reqs))
	var rel relations
	sem := make(chan struct{}, EnqueueManyConcurrency)
	var wg sync.WaitGroup
	for i, req := range reqs {
		done[i] = make(chan struct{})
		k, err := c.kindOf(req.Type)
		if err != nil {
			out[i].Err = err
			close(done[i])
			continue
		}
		req = withDefaults(req, k)
		refs := []batchRef{
			{refTarget, req.ChannelID, req.TargetKey},
			{refIdem, req.ChannelID, req.IdempotencyKey},
			{refID, req.ChannelID, req.ID},
		}
		if key, err := k.jt.Key([]byte(inputOf(Job{Input: req.Input}))); err == nil {
			refs = append(refs, batchRef{refKey, key.KVKey, ""})
		}
		var before []chan struct{}
		for _, p := range rel.join(refs, i) {
			before = append(before, done[p])
		}
		if err := ctx.Err(); err != nil {
			out[i].Err = err
			close(done[i])
			continue
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			out[i].Err = ctx.Err()
			close(done[i])
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			defer close(done[i])
			for _, b := range before {
				select {
				case <-b:
				case <-ctx.Done():
					out[i].Err = ctx.Err()
					return
				}
			}
			out[i].Result, out[i].Err = c.enqueue(ctx, k, req)
		}()
	}
	wg.Wait()
	return out
}

// batchRef is what relates the requests of one EnqueueMany: a channel's
// target, idempotency key or id, or a KV key of the key layer.
type batchRef struct {
	kind refKind
	a, b string
}

type refKind uint8

const (
	refTarget refKind = iota
	refIdem
	refID
	refKey
)

// relations groups the requests of a batch that share refs, directly or
// through others (a union-find over the refs), and knows each group's
// latest request.
type relations struct {
	parent map[batchRef]batchRef
	last   map[batchRef]int // by group root: its latest request
}

// root is the root of r's group, r itself when r is new.
func (g *relations) root(r batchRef) batchRef {
	for {
		p, ok := g.parent[r]
		if !ok || p == r {
			return r
		}
		if gp, ok := g.parent[p]; ok {
			g.parent[r] = gp // halve the path
		}
		r = p
	}
}

// join puts request i, with refs, into one group with every group those
// refs are in, and returns the latest request of each of those groups:
// the requests i waits for (each waited, in turn, for the earlier
// requests of its group).
func (g *relations) join(refs []batchRef, i int) []int {
	if g.parent == nil {
		g.parent, g.last = make(map[batchRef]batchRef), make(map[batchRef]int)
	}
	var prev []int
	var roots []batchRef
	for _, r := range refs {
		rt := g.root(r)
		dup := false
		for _, seen := range roots {
			dup = dup || seen == rt
		}
		if dup {
			continue
		}
		roots = append(roots, rt)
		if p, ok := g.last[rt]; ok {
			prev = append(prev, p)
			delete(g.last, rt)
		}
	}
	top := roots[0]
	for _, rt := range roots {
		g.parent[rt] = top
	}
	g.last[top] = i
	return prev
}
