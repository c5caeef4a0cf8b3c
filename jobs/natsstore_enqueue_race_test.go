package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestNATSStoreUnbatchedEnqueueRacesWorkers runs unbatched enqueues of a
// few targets (each superseding the target's job before it) against
// workers that claim, renew and settle, every party over a connection of
// its own, a fixed number of operations each, then checks the channel:
// every enqueue that succeeded made one job, a target's jobs hold distinct
// generations, its newest the target's own, and no target has more than
// one active job (the newest); a job is completed only by a worker whose
// claim held.
func TestNATSStoreUnbatchedEnqueueRacesWorkers(t *testing.T) {
	t.Parallel()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	s := natstest.Run(t)
	ctx := context.Background()
	st := newUnbatchedStore(t, s)
	const producers, workers, enqueues, workerOps, targets = 4, 3, 25, 60, 3

	var mu sync.Mutex
	enqueued := map[string]Job{}
	settled := map[string]bool{}
	var wg sync.WaitGroup
	for p := range producers {
		store := openTestNATSStore(t, s, st, nil)
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(p)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range enqueues {
				id := fmt.Sprintf("p%d-%d", p, i)
				out, err := store.Enqueue(ctx, testEnqueueRequest(crashChannel, id, fmt.Sprintf("t%d", rng.IntN(targets))))
				if !assert.NoError(t, err, id) {
					return
				}
				mu.Lock()
				enqueued[id] = out.Job
				mu.Unlock()
			}
		}()
	}
	for w := range workers {
		store := openTestNATSStore(t, s, st, nil)
		rng := rand.New(rand.NewPCG(uint64(seed), uint64(100+w)))
		owner := fmt.Sprintf("w%d", w)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range workerOps {
				got, err := store.Claim(ctx, ClaimRequest{ChannelID: crashChannel, Owner: owner, Count: 1, TTL: time.Hour})
				if !assert.NoError(t, err) || len(got) == 0 {
					continue
				}
				j := got[0]
				if rng.IntN(2) == 0 {
					r, err := store.Renew(ctx, RenewRequest{Claim: ClaimOf(j), ExpectedRevision: j.Revision, TTL: time.Hour})
					if errors.Is(err, ErrConflict) {
						continue // superseded since the claim
					}
					if !assert.NoError(t, err) {
						continue
					}
					j = r
				}
				_, err = store.Settle(ctx, SettleRequest{Claim: ClaimOf(j)})
				if errors.Is(err, ErrConflict) {
					continue
				}
				if assert.NoError(t, err) {
					mu.Lock()
					settled[j.ID] = true
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()

	reader := openTestNATSStore(t, s, st, nil)
	page, err := reader.List(ctx, ListRequest{ChannelID: crashChannel, Limit: 100})
	require.NoError(t, err)
	var listed []Summary
	listed = append(listed, page.Jobs...)
	for page.Next != nil {
		page, err = reader.List(ctx, ListRequest{ChannelID: crashChannel, Limit: 100, After: page.Next})
		require.NoError(t, err)
		listed = append(listed, page.Jobs...)
	}
	require.Len(t, listed, len(enqueued), "one job per successful enqueue")
	byTarget := map[string][]Detail{}
	for _, sum := range listed {
		d, err := reader.Get(ctx, crashChannel, sum.ID)
		require.NoError(t, err)
		_, ok := enqueued[sum.ID]
		assert.True(t, ok, "job %s was listed and never enqueued", sum.ID)
		assert.Equal(t, settled[sum.ID], d.Job.State == StateCompleted, "job %s: %s, settled by a worker: %t", sum.ID, d.Job.State, settled[sum.ID])
		byTarget[d.Job.TargetKey] = append(byTarget[d.Job.TargetKey], d)
	}
	for target, ds := range byTarget {
		gens := map[uint64]string{}
		active := 0
		var newest Detail
		for _, d := range ds {
			if other, ok := gens[d.Job.TargetGeneration]; ok {
				t.Errorf("target %s: jobs %s and %s share generation %d", target, other, d.Job.ID, d.Job.TargetGeneration)
			}
			gens[d.Job.TargetGeneration] = d.Job.ID
			if d.Job.State.Active() {
				active++
				assert.Equal(t, d.Target.Generation, d.Job.TargetGeneration, "target %s: active job %s is not the newest", target, d.Job.ID)
			}
			if d.Job.TargetGeneration > newest.Job.TargetGeneration {
				newest = d
			}
		}
		assert.LessOrEqual(t, active, 1, "target %s: %d active jobs", target, active)
		assert.Equal(t, newest.Target.Generation, newest.Job.TargetGeneration, "target %s: the newest job is the target's", target)
		assert.Equal(t, uint64(len(ds)), newest.Job.TargetGeneration, "target %s: one generation per job", target)
	}
}
