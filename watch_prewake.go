package jobkeys

import "time"

// prewake is wake for a write of kvKey that the coordinator whose key
// table is t is about to make, holding the key's lane, that would leave
// the key at state st (revision rev): it wakes the waiters of t that the
// change would wake, so that their acquisitions join the write's batch
// (see keyTable.prewake), and returns how many it woke. It records
// nothing of st, which is not stored: the Watcher goes on with the key's
// stored changes, and the woken waiters count against the free slots
// until they come back (a try that acquired closes its subscription; one
// that found the key busy rearms), as any woken waiter does.
//
// It wakes only waiters whose turn it is at once on st (see turn: no job
// of another process queued ahead of theirs beyond the free slots), and
// stops at the first waiter of another coordinator, which cannot join the
// batch, so that no waiter is woken ahead of a job queued before its own.
// Called with no lock held.
func (w *Watcher) prewake(kvKey string, t *keyTable, st *KeyState, rev uint64, now time.Time) int {
	v, ok := w.waited.Load(kvKey)
	if !ok || st == nil {
		return 0
	}
	kw := v.(*keyWatch)
	if kw.nwaiting.Load() == 0 {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed || kw.sw.ended || kw.sw.keys[kvKey] != kw || len(kw.waiters) == 0 || rev <= kw.rev {
		return 0
	}
	limit := st.MaxActive
	woken := 0
	for _, sub := range kw.waiters {
		limit = max(limit, sub.waiter.limit)
		if sub.waiter.woken {
			woken++
		}
	}
	live := 0
	for i := range st.Active {
		if st.Active[i].LeaseExpiresAt.After(now) {
			live++
		}
	}
	free := max(limit-live, 0)
	if woken >= free {
		return 0
	}
	kw.order(st.Queued)
	n, local := 0, 0
	for _, sub := range kw.waiters {
		if woken >= free {
			break
		}
		wt := sub.waiter
		i := wt.index
		ahead := i - local // jobs queued ahead of wt's that no waiter here waits for
		if i >= 0 {
			local++
		}
		if wt.woken {
			continue
		}
		if wt.table != t || wt.seen >= rev || !kw.turn(i, ahead, free).IsZero() {
			break
		}
		wt.woken, wt.wokenAt = true, kw.seq
		woken++
		n++
		sub.signal()
	}
	return n
}
