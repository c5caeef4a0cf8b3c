package jobkeys

// Regression test for the per-key lane: a coordinator's pauses (pacing on a
// contended key, backoff after a lost race) must not hold the lane, or its
// own renewal queues behind every local operation's pause on the key while
// another process keeps writing it, and loses race after race until
// ErrContention. With the pauses taken under the lane (coordinator.go before
// commit a3e1d5f) the test fails within a few renewals, for 5 and for 50
// local waiters; without local waiters it passes either way.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// laneSlowStore adds delay to every call, as a network store would.
type laneSlowStore struct {
	Store
	delay time.Duration
}

func (s laneSlowStore) pause(ctx context.Context) error {
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (s laneSlowStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	if err := s.pause(ctx); err != nil {
		return nil, 0, err
	}
	return s.Store.Get(ctx, service, key)
}

func (s laneSlowStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	if err := s.pause(ctx); err != nil {
		return 0, err
	}
	return s.Store.Create(ctx, service, key, value)
}

func (s laneSlowStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	if err := s.pause(ctx); err != nil {
		return 0, err
	}
	return s.Store.Update(ctx, service, key, value, revision)
}

func (s laneSlowStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	if err := s.pause(ctx); err != nil {
		return err
	}
	return s.Store.Delete(ctx, service, key, revision)
}

// A slot holder's renewals succeed while another coordinator keeps writing
// the key and the holder's own coordinator runs acquisitions on it that stay
// blocked (the reviewer's repro: a store with 300µs latency, default Config).
// The renewal still loses races to the other coordinator, which writes
// without pause; the test logs the most lost by one renewal (up to about 25
// of the 64 allowed in trial runs, decaying geometrically).
func TestCoordinatorRenewNotStarvedByLocalWaiters(t *testing.T) {
	t.Parallel()
	for _, waiters := range []int{5, 50} {
		t.Run(fmt.Sprintf("waiters=%d", waiters), func(t *testing.T) {
			t.Parallel()
			laneRenewUnderLocalWaiters(t, waiters)
		})
	}
}

func laneRenewUnderLocalWaiters(t *testing.T, waiters int) {
	const (
		renewals = 40
		gap      = 20 * time.Millisecond // between renewals
	)
	store := laneSlowStore{Store: NewMemoryStore(), delay: 300 * time.Microsecond}
	holder, err := NewCoordinator(store, nil)
	jkNoErr(t, err)
	other, err := NewCoordinator(store, nil)
	jkNoErr(t, err)
	service := fmt.Sprintf("renewlane%d", waiters)
	policy := Policy{Key: benchPolicy.Key, MaxActive: 1, MaxQueuedPerKey: 1000}
	payload := benchPayload(0)
	bg := context.Background()
	admit := func(c *KeyCoordinator, ctx context.Context, id string) error {
		adm, err := c.Admit(ctx, AdmitRequest{Service: service, JobType: benchJobType, JobID: id, Payload: payload, Policy: policy})
		if err == nil && adm.Kind != KindAccepted {
			err = fmt.Errorf("admit %s: %s %s", id, adm.Kind, adm.Reason)
		}
		return err
	}
	jkNoErr(t, admit(holder, bg, "held"))
	acq, err := holder.Acquire(bg, AcquireRequest{Service: service, JobType: benchJobType, JobID: "held", Payload: payload, Policy: policy})
	jkNoErr(t, err)
	jkEqual(t, KindAcquired, acq.Kind, "acquire held")
	for i := range waiters {
		jkNoErr(t, admit(holder, bg, fmt.Sprintf("w%d", i)))
	}

	ctx, stop := context.WithCancel(bg)
	var wg sync.WaitGroup
	defer func() {
		stop()
		wg.Wait()
	}()
	var otherWrites, checks atomic.Int64
	// Another process: admits and removes a job on the key without pause.
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			id := fmt.Sprintf("x%d", i)
			err := admit(other, ctx, id)
			if err == nil {
				var rm Removal
				rm, err = other.RemoveQueued(ctx, RemoveRequest{Service: service, JobType: benchJobType, JobID: id, Payload: payload, Policy: policy})
				if err == nil && rm.Kind != KindRemoved {
					err = fmt.Errorf("remove %s: %s", id, rm.Kind)
				}
			}
			if err != nil {
				jkCheck(t, ctx.Err() != nil, "other coordinator: %v", err)
				return
			}
			otherWrites.Add(2)
		}
	})
	// The holder's coordinator also runs jobs waiting for the slot.
	for i := range waiters {
		wg.Go(func() {
			id := fmt.Sprintf("w%d", i)
			for ctx.Err() == nil {
				b, err := holder.Acquire(ctx, AcquireRequest{Service: service, JobType: benchJobType, JobID: id, Payload: payload, Policy: policy})
				if err != nil {
					jkCheck(t, ctx.Err() != nil, "acquire %s: %v", id, err)
					return
				}
				if b.Kind != KindBlocked || b.Reason != ReasonActiveLimit {
					t.Errorf("acquire %s: %s %s, want blocked by the active limit", id, b.Kind, b.Reason)
					return
				}
				checks.Add(1)
			}
		})
	}

	var worst time.Duration
	mostLost := int64(0)
	for i := range renewals {
		lostBefore := holder.stats.conflicts.Load()
		start := time.Now()
		r, err := holder.Renew(ctx, RenewRequest{Lease: acq.Lease})
		took := time.Since(start)
		lost := holder.stats.conflicts.Load() - lostBefore
		worst, mostLost = max(worst, took), max(mostLost, lost)
		if errors.Is(err, ErrContention) {
			t.Fatalf("renewal %d of %d after %v: %v", i+1, renewals, took, err)
		}
		if err != nil || r.Kind != KindRenewed {
			t.Fatalf("renewal %d of %d after %v: %v %v, want renewed", i+1, renewals, took, r.Kind, err)
		}
		time.Sleep(gap)
	}
	stop()
	wg.Wait()
	t.Logf("%d renewals: slowest %v, most races lost by one %d; other coordinator wrote %d times, %d blocked acquisitions",
		renewals, worst, mostLost, otherWrites.Load(), checks.Load())
	jkTrue(t, otherWrites.Load() > 0 && checks.Load() > 0, "no contention was created")
}
