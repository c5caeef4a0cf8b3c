package jobs

import (
	"container/heap"
	"time"
)

// A MemoryStore's retention (see [Retention]): a job that finishes while
// the store has a retention is queued by the time it is due to go; every
// call of the store that takes its lock first deletes the jobs whose time
// has come, by the store's clock, with their idempotency entry, their
// artifact and their target's generation while it is theirs.

// memExpiry is a finished job due to be deleted at at.
type memExpiry struct {
	at  time.Time
	job *Job // the stored value: a job stored again since is not deleted
}

// memExpiries is a min-heap of memExpiry by at (container/heap).
type memExpiries []memExpiry

func (h memExpiries) Len() int           { return len(h) }
func (h memExpiries) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h memExpiries) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *memExpiries) Push(x any)        { *h = append(*h, x.(memExpiry)) }
func (h *memExpiries) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// useRetention implements retentionUser: jobs that finish from now on are
// deleted after r.
func (s *MemoryStore) useRetention(r retention, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r.keepsAll() {
		s.retention = nil
		return nil
	}
	s.retention = &r
	return nil
}

// noteFinished queues j, just stored in a final state, for deletion after
// its retention. Called with mu held.
func (s *MemoryStore) noteFinished(j *Job) {
	d := s.retention.of(j.State)
	if d < 0 {
		return
	}
	heap.Push(&s.expiries, memExpiry{at: j.UpdatedAt.Add(d), job: j})
}

// expire deletes the finished jobs whose retention has passed at now.
// Called with mu held.
func (s *MemoryStore) expire(now time.Time) {
	for len(s.expiries) > 0 && !s.expiries[0].at.After(now) {
		e := heap.Pop(&s.expiries).(memExpiry)
		j := e.job
		ch := s.channels[j.ChannelID]
		if ch == nil || ch.jobs[j.ID] != j {
			continue // its channel was deleted since
		}
		delete(ch.jobs, j.ID)
		delete(ch.artifacts, j.ID)
		if ch.idempotency[j.IdempotencyKey] == j.ID {
			delete(ch.idempotency, j.IdempotencyKey)
		}
		if ch.targets[j.TargetKey] == j.TargetGeneration && len(ch.active[j.TargetKey]) == 0 {
			delete(ch.targets, j.TargetKey)
		}
	}
}
