package jobkeys

// Revision audit: the randomized, fault and cluster tests create their
// bucket with auditCreateBucket, which keeps every revision of every key,
// and afterwards read the whole history with auditRead and check it with
// auditCheck against what the clients did (their operation log).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// auditHistory is how many messages per key the audited bucket's stream
// keeps: in effect all of them. KV buckets allow History up to 64; the
// stream's MaxMsgsPerSubject is raised past that after creation (the KV
// API only needs it positive), so a lagging reader never misses one.
const auditHistory = 1 << 40

// auditCreateBucket creates the bucket of service before any store opens
// it, with replicas and storage as given and every revision kept, and
// returns its name.
func auditCreateBucket(t testing.TB, ctx context.Context, js jetstream.JetStream, service string, replicas int, storage jetstream.StorageType) string {
	t.Helper()
	bucket := BucketPrefixDefault + "_" + service
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, History: 64, Replicas: replicas, Storage: storage}); err != nil {
		t.Fatalf("create audited bucket %s: %v", bucket, err)
	}
	stream, err := js.Stream(ctx, "KV_"+bucket)
	require.NoError(t, err, "stream of bucket %s", bucket)
	cfg := stream.CachedInfo().Config
	cfg.MaxMsgsPerSubject = auditHistory
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("keep every revision of bucket %s: %v", bucket, err)
	}
	return bucket
}

// auditEntry is one revision of one key.
type auditEntry struct {
	key     string
	rev     uint64
	deleted bool // a delete or purge marker
	value   []byte
	state   *KeyState // parsed value; nil for markers
	err     error     // why the value does not parse
}

// auditRead reads every revision of every key of bucket in stream order
// and fails the test unless the revisions are exactly the stream's
// sequence numbers from 1 to its last: no message was lost or skipped.
func auditRead(t testing.TB, ctx context.Context, js jetstream.JetStream, bucket string) []auditEntry {
	t.Helper()
	kv, err := js.KeyValue(ctx, bucket)
	require.NoError(t, err, "audit: open %s", bucket)
	stream, err := js.Stream(ctx, "KV_"+bucket)
	require.NoError(t, err, "audit: stream of %s", bucket)
	info, err := stream.Info(ctx)
	require.NoError(t, err, "audit: stream info of %s", bucket)
	w, err := kv.WatchAll(ctx, jetstream.IncludeHistory())
	require.NoError(t, err, "audit: watch %s", bucket)
	defer func() { _ = w.Stop() }()
	var entries []auditEntry
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			t.Fatalf("audit: reading %s: %v after %d revisions", bucket, ctx.Err(), len(entries))
		}
		if e == nil {
			// The end of what the stream held when the watch began, as the
			// watcher counted it; on a cluster just after a leader change it
			// can come early. Read on to the last sequence.
			if info.State.LastSeq == 0 || len(entries) > 0 && entries[len(entries)-1].rev >= info.State.LastSeq {
				break
			}
			continue
		}
		a := auditEntry{key: e.Key(), rev: e.Revision(), deleted: e.Operation() != jetstream.KeyValuePut, value: slices.Clone(e.Value())}
		if !a.deleted {
			a.state, a.err = ParseState(a.value)
		}
		entries = append(entries, a)
		if a.rev >= info.State.LastSeq {
			break
		}
	}
	if info.State.FirstSeq > 1 && info.State.Msgs > 0 {
		t.Errorf("audit: stream of %s starts at sequence %d: revisions were dropped", bucket, info.State.FirstSeq)
	}
	for i, e := range entries {
		if e.rev != uint64(i+1) {
			t.Fatalf("audit: revision %d of %s is sequence %d: a revision is missing", i+1, bucket, e.rev)
		}
	}
	if uint64(len(entries)) != info.State.LastSeq {
		t.Fatalf("audit: read %d revisions of %s, the stream's last sequence is %d", len(entries), bucket, info.State.LastSeq)
	}
	return entries
}

// auditFacts is what the clients did, distilled from their operation log:
// the audit uses it to explain every change between two revisions.
type auditFacts struct {
	releaseCalled    map[string]bool // slot tokens someone tried to release
	removeCalled     map[string]bool // job ids someone tried to remove from the queue
	restoreCalled    map[string]bool // replacement job ids someone tried to restore over
	replacedReported map[string]bool // job ids an admission reported replaced
	staleReported    map[string]bool // slot tokens an acquisition reported stale
	acquiredTokens   map[string]bool // tokens of acquisitions that succeeded
	// uncertain counts operations of each kind whose outcome is unknown (an
	// error other than ErrContention: it may or may not have been applied).
	uncertain map[opKind]int
	// written holds the encoding of every state a client was told it
	// wrote; each must be a revision. deletes counts writes that emptied a
	// key.
	written [][]byte
	deletes int
}

func newAuditFacts(log []*linOp) auditFacts {
	f := auditFacts{releaseCalled: map[string]bool{}, removeCalled: map[string]bool{}, restoreCalled: map[string]bool{},
		replacedReported: map[string]bool{}, staleReported: map[string]bool{}, acquiredTokens: map[string]bool{}, uncertain: map[opKind]int{}}
	for _, op := range log {
		in, out := &op.in, &op.out
		switch in.kind {
		case opRelease:
			f.releaseCalled[in.lease.SlotToken] = true
		case opRemove:
			f.removeCalled[in.job] = true
		case opRestore:
			f.restoreCalled[in.job] = true
		}
		if out.err != nil {
			if !errors.Is(out.err, ErrContention) {
				f.uncertain[in.kind]++
			}
			continue
		}
		if r := out.admission.Replaced; r != nil {
			f.replacedReported[r.ID] = true
		}
		for _, s := range out.acquisition.Stale {
			f.staleReported[s.SlotToken] = true
		}
		if out.acquisition.Kind == KindAcquired {
			f.acquiredTokens[out.acquisition.Lease.SlotToken] = true
		}
		if st := op.state(); st != nil {
			if st.Empty() {
				f.deletes++
			} else {
				f.written = append(f.written, appendState(nil, st))
			}
		}
	}
	return f
}

// auditSummary is what the audit saw.
type auditSummary struct {
	Keys, Revisions, Deletes int
	MaxActiveSeen            int // most slots in one revision
	MaxLiveSeen              int // most slots with a lease beyond the revision's updatedAt
	JobsQueued               int // distinct job ids that were ever queued
	Slots                    int // distinct slot tokens
	Released, TakenOver      int // how the slots that ended did end
}

// auditCheck checks the history of every key:
//
//   - every value parses, validates and belongs to its KV key;
//   - no revision holds more slots than the key's MaxActive (under
//     FailStale and Block alike: an acquisition counts stale slots it keeps),
//     hence never more live ones; no job id is twice in a revision;
//   - updatedAt and staleTakeoverCount never go back while the key lives;
//   - every change between two revisions is explained by what clients did:
//     a slot leaves by a release of its token or by a takeover after its
//     lease expired (under Block only by its own job's retry), reported in
//     the taker's Stale unless it was that retry; a queued job leaves by
//     acquiring a slot, a removal, a replacement reported to the admitting
//     client, or a restore over it; a new slot has a token some acquisition
//     returned;
//   - every state a client was told it wrote is one of the revisions;
//   - with drained set, every key ends deleted: no job is left behind.
//
// Operations with an unknown outcome (see auditFacts.uncertain) excuse the
// report of their kind not reaching the client, never a broken invariant.
func auditCheck(t testing.TB, entries []auditEntry, facts auditFacts, policyOf func(kvKey string) (Policy, bool), drained bool) auditSummary {
	t.Helper()
	var sum auditSummary
	fails := 0
	fail := func(format string, args ...any) {
		t.Helper()
		if fails++; fails <= 20 {
			t.Errorf("audit: "+format, args...)
		}
	}
	byKey := map[string][]auditEntry{}
	var keys []string
	values := map[string]bool{}
	for _, e := range entries {
		if _, ok := byKey[e.key]; !ok {
			keys = append(keys, e.key)
		}
		byKey[e.key] = append(byKey[e.key], e)
		if !e.deleted {
			values[string(e.value)] = true
		}
	}
	sum.Keys, sum.Revisions = len(keys), len(entries)
	queuedJobs, slots := map[string]bool{}, map[string]bool{}
	for _, key := range keys {
		pol, ok := policyOf(key)
		if !ok {
			fail("key %s: not a key the test used", key)
			continue
		}
		var prev *KeyState
		for _, e := range byKey[key] {
			where := fmt.Sprintf("key %s revision %d", key, e.rev)
			if e.deleted {
				sum.Deletes++
				if prev != nil {
					checkAuditTransition(fail, where, pol, facts, prev, nil, &sum)
				}
				prev = nil
				continue
			}
			st := e.state
			if e.err != nil {
				fail("%s: does not parse: %v", where, e.err)
				prev = nil
				continue
			}
			auditState(fail, where, key, pol, st, prev, &sum, slots, queuedJobs)
			checkAuditTransition(fail, where, pol, facts, prev, st, &sum)
			prev = st
		}
		if drained && prev != nil {
			fail("key %s ends with %d active and %d queued after the drain: %s / %v", key, len(prev.Active), len(prev.Queued),
				modelActiveIDs(prev.Active), auditQueuedIDs(prev.Queued))
		}
	}
	sum.JobsQueued, sum.Slots = len(queuedJobs), len(slots)
	missing := 0
	for _, w := range facts.written {
		if !values[string(w)] {
			if missing++; missing <= 3 {
				fail("a state a client was told it wrote is not among the revisions: %s", w)
			}
		}
	}
	if missing > 0 {
		fail("%d acknowledged writes are missing", missing)
	}
	if sum.Deletes < facts.deletes {
		fail("%d deletes acknowledged, %d delete markers in the bucket", facts.deletes, sum.Deletes)
	}
	return sum
}

func auditQueuedIDs(q []QueuedJob) []string {
	var ids []string
	for _, e := range q {
		ids = append(ids, e.JobID)
	}
	return ids
}

// auditState checks st, the state of revision where of key, on its own and
// after prev (nil: none), and records its slots and queued jobs.
func auditState(fail func(string, ...any), where, key string, pol Policy, st, prev *KeyState, sum *auditSummary, slots, queuedJobs map[string]bool) {
	if st.Service+"."+st.JobType+"."+st.KeyHash != key {
		fail("%s: holds the state of %s.%s.%s", where, st.Service, st.JobType, st.KeyHash)
	}
	if st.MaxActive != pol.MaxActive || st.MaxQueuedPerKey != pol.MaxQueuedPerKey {
		fail("%s: limits %d/%d, the policy's are %d/%d", where, st.MaxActive, st.MaxQueuedPerKey, pol.MaxActive, pol.MaxQueuedPerKey)
	}
	if st.Empty() {
		fail("%s: an empty state was written instead of deleted", where)
	}
	live := 0
	for _, a := range st.Active {
		if a.LeaseExpiresAt.After(st.UpdatedAt) {
			live++
		}
		slots[a.SlotToken] = true
	}
	sum.MaxActiveSeen = max(sum.MaxActiveSeen, len(st.Active))
	sum.MaxLiveSeen = max(sum.MaxLiveSeen, live)
	if len(st.Active) > pol.MaxActive {
		fail("%s: %d slots (%d live at updatedAt %s) exceed MaxActive %d: %s", where, len(st.Active), live,
			st.UpdatedAt.Format(jsjson.TimeLayout), pol.MaxActive, modelActiveIDs(st.Active))
	}
	seen := map[string]bool{}
	for _, a := range st.Active {
		if seen[a.JobID] {
			fail("%s: job %s holds two slots", where, a.JobID)
		}
		seen[a.JobID] = true
	}
	for _, q := range st.Queued {
		if seen[q.JobID] {
			fail("%s: job %s is queued twice, or queued while it holds a slot", where, q.JobID)
		}
		seen[q.JobID] = true
		queuedJobs[q.JobID] = true
	}
	if prev != nil {
		if st.UpdatedAt.Before(prev.UpdatedAt) {
			fail("%s: updatedAt %s is before the previous revision's %s: a write rested on an outdated state",
				where, st.UpdatedAt.Format(jsjson.TimeLayout), prev.UpdatedAt.Format(jsjson.TimeLayout))
		}
		if st.StaleTakeoverCount < prev.StaleTakeoverCount {
			fail("%s: staleTakeoverCount went from %d to %d", where, prev.StaleTakeoverCount, st.StaleTakeoverCount)
		}
	}
}

// checkAuditTransition explains the change from prev to next (nil: deleted;
// prev nil: created).
func checkAuditTransition(fail func(string, ...any), where string, pol Policy, facts auditFacts, prev, next *KeyState, sum *auditSummary) {
	var before, after []ActiveSlot
	var queuedBefore []QueuedJob
	if prev != nil {
		before, queuedBefore = prev.Active, prev.Queued
	}
	if next != nil {
		after = next.Active
	}
	added := auditAddedSlots(fail, where, facts, before, after)
	var removed []ActiveSlot
	for _, b := range before {
		if !slices.ContainsFunc(after, func(a ActiveSlot) bool { return a.SlotToken == b.SlotToken }) {
			removed = append(removed, b)
		}
	}
	if len(added) == 0 {
		auditReleased(fail, where, facts, removed, sum)
	} else {
		auditTakenOver(fail, where, pol, facts, added[0], removed, prev, next, sum)
	}
	if len(added) == 0 && prev != nil && next != nil && next.StaleTakeoverCount != prev.StaleTakeoverCount {
		fail("%s: staleTakeoverCount changed from %d to %d without an acquisition", where, prev.StaleTakeoverCount, next.StaleTakeoverCount)
	}
	auditQueueLeft(fail, where, facts, queuedBefore, added, next)
}

// auditAddedSlots returns the slots of after that before lacks, and fails
// for one no acquisition returned, or for more than one.
func auditAddedSlots(fail func(string, ...any), where string, facts auditFacts, before, after []ActiveSlot) []ActiveSlot {
	var added []ActiveSlot
	for _, a := range after {
		if !slices.ContainsFunc(before, func(b ActiveSlot) bool { return b.SlotToken == a.SlotToken }) {
			added = append(added, a)
			if !facts.acquiredTokens[a.SlotToken] && facts.uncertain[opAcquire] == 0 {
				fail("%s: slot %s/%s appeared, but no acquisition returned that token", where, a.JobID, a.SlotToken)
			}
		}
	}
	if len(added) > 1 {
		fail("%s: %d slots appeared in one write", where, len(added))
	}
	return added
}

// auditReleased checks the slots removed by a write that added none: a
// release frees one slot; nothing else frees any.
func auditReleased(fail func(string, ...any), where string, facts auditFacts, removed []ActiveSlot, sum *auditSummary) {
	if len(removed) > 1 {
		fail("%s: %d slots vanished in one write without an acquisition", where, len(removed))
	}
	for _, b := range removed {
		if !facts.releaseCalled[b.SlotToken] {
			fail("%s: slot %s/%s vanished without a release of its token", where, b.JobID, b.SlotToken)
		}
		sum.Released++
	}
}

// auditTakenOver checks the slots removed by the acquisition of taker: it
// frees only expired slots, under FailStale any (and reports those of
// other jobs), under Block only its own job's.
func auditTakenOver(fail func(string, ...any), where string, pol Policy, facts auditFacts, taker ActiveSlot, removed []ActiveSlot, prev, next *KeyState, sum *auditSummary) {
	for _, b := range removed {
		sum.TakenOver++
		if b.LeaseExpiresAt.After(next.UpdatedAt) {
			fail("%s: live slot %s/%s (lease to %s) was taken over by %s/%s at %s", where, b.JobID, b.SlotToken,
				b.LeaseExpiresAt.Format(jsjson.TimeLayout), taker.JobID, taker.SlotToken, next.UpdatedAt.Format(jsjson.TimeLayout))
			continue
		}
		if taker.JobID == b.JobID {
			continue // the job's own retry replaced its stale slot
		}
		if pol.StalePolicy == Block {
			fail("%s: under Block, stale slot %s/%s was dropped by another job's acquisition (%s)", where, b.JobID, b.SlotToken, taker.JobID)
			continue
		}
		if !facts.staleReported[b.SlotToken] && facts.uncertain[opAcquire] == 0 {
			fail("%s: stale slot %s/%s was taken over by %s but no acquisition reported it", where, b.JobID, b.SlotToken, taker.JobID)
		}
	}
	if prev != nil && next.StaleTakeoverCount-prev.StaleTakeoverCount != len(removed) {
		fail("%s: staleTakeoverCount rose by %d, %d slots were taken over", where, next.StaleTakeoverCount-prev.StaleTakeoverCount, len(removed))
	}
}

// auditQueueLeft checks that every job of queuedBefore that left the
// queue did so by acquiring (a slot of added), a removal, a restore or a
// reported replacement.
func auditQueueLeft(fail func(string, ...any), where string, facts auditFacts, queuedBefore []QueuedJob, added []ActiveSlot, next *KeyState) {
	for _, q := range queuedBefore {
		if next != nil && slices.ContainsFunc(next.Queued, func(e QueuedJob) bool { return e.JobID == q.JobID }) {
			continue
		}
		switch {
		case next != nil && slices.ContainsFunc(added, func(a ActiveSlot) bool { return a.JobID == q.JobID }):
		case facts.removeCalled[q.JobID], facts.restoreCalled[q.JobID]:
		case facts.replacedReported[q.JobID]:
		case next != nil && facts.uncertain[opAdmit] > 0 && len(next.Queued) > 0:
		default:
			fail("%s: queued job %s left the queue without acquiring, a removal or a reported replacement", where, q.JobID)
		}
	}
}

// String formats the summary for logs and RELIABILITY.md.
func (s auditSummary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d keys, %d revisions (%d deletes), %d jobs queued, %d slots (%d released, %d taken over), max %d slots / %d live in a revision",
		s.Keys, s.Revisions, s.Deletes, s.JobsQueued, s.Slots, s.Released, s.TakenOver, s.MaxActiveSeen, s.MaxLiveSeen)
	return b.String()
}

// auditAll reads bucket's history and checks it; a shorthand for the
// tests.
func auditAll(t testing.TB, js jetstream.JetStream, bucket string, log []*linOp, policyOf func(string) (Policy, bool), drained bool) auditSummary {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	entries := auditRead(t, ctx, js, bucket)
	sum := auditCheck(t, entries, newAuditFacts(log), policyOf, drained)
	t.Logf("audit of %s: %v", bucket, sum)
	return sum
}

// TestAuditCatchesViolations feeds auditCheck hand-made histories that
// break each rule, so that a passing audit means something.
func TestAuditCatchesViolations(t *testing.T) {
	t.Parallel()
	pol, err := Policy{Key: []string{"k"}, MaxActive: 1, HeartbeatTTL: time.Second, HeartbeatInterval: 100 * time.Millisecond}.Normalize()
	require.NoError(t, err)
	key := modelKey
	t0 := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	slot := func(job, token string, start time.Time) ActiveSlot {
		return ActiveSlot{JobID: job, SlotToken: token, InstanceID: "w", StartedAt: start, HeartbeatAt: start, LeaseExpiresAt: start.Add(time.Second)}
	}
	state := func(at time.Time, active []ActiveSlot, queued ...string) *KeyState {
		s := emptyState(key, pol, at)
		s.Active = active
		for _, q := range queued {
			s.Queued = append(s.Queued, QueuedJob{JobID: q, CreatedAt: t0, RequestID: q})
		}
		return s
	}
	entry := func(rev uint64, s *KeyState) auditEntry {
		if s == nil {
			return auditEntry{key: key.KVKey, rev: rev, deleted: true}
		}
		v := appendState(nil, s)
		st, err := ParseState(v)
		return auditEntry{key: key.KVKey, rev: rev, value: v, state: st, err: err}
	}
	facts := func(tokens ...string) auditFacts {
		f := newAuditFacts(nil)
		for _, tok := range tokens {
			f.acquiredTokens[tok] = true
		}
		return f
	}
	policyOf := func(string) (Policy, bool) { return pol, true }
	cases := []struct {
		name    string
		entries []auditEntry
		facts   auditFacts
		drained bool
		want    string
	}{
		{"two slots", []auditEntry{entry(1, state(t0, []ActiveSlot{slot("a", "ta", t0), slot("b", "tb", t0)}))}, facts("ta", "tb"), false, "exceed MaxActive"},
		{"live takeover", []auditEntry{
			entry(1, state(t0, []ActiveSlot{slot("a", "ta", t0)})),
			entry(2, state(t0.Add(500*time.Millisecond), []ActiveSlot{slot("b", "tb", t0.Add(500*time.Millisecond))})),
		}, facts("ta", "tb"), false, "was taken over"},
		{"unreported takeover", []auditEntry{
			entry(1, state(t0, []ActiveSlot{slot("a", "ta", t0)})),
			entry(2, func() *KeyState {
				s := state(t0.Add(2*time.Second), []ActiveSlot{slot("b", "tb", t0.Add(2*time.Second))})
				s.StaleTakeoverCount = 1
				return s
			}()),
		}, facts("ta", "tb"), false, "no acquisition reported it"},
		{"lost queued job", []auditEntry{
			entry(1, state(t0, nil, "q1", "q2")),
			entry(2, state(t0, nil, "q2")),
		}, facts(), false, "left the queue"},
		{"not drained", []auditEntry{entry(1, state(t0, nil, "q1"))}, facts(), true, "after the drain"},
		{"vanished slot", []auditEntry{entry(1, state(t0, []ActiveSlot{slot("a", "ta", t0)})), entry(2, nil)}, facts("ta"), false, "without a release"},
		{"time travel", []auditEntry{
			entry(1, state(t0, nil, "q1")),
			entry(2, state(t0.Add(-time.Second), nil, "q1", "q2")),
		}, facts(), false, "before the previous"},
		{"corrupt", []auditEntry{{key: key.KVKey, rev: 1, value: []byte(`{"version":2}`), err: errors.New("field version must be 1")}}, facts(), false, "does not parse"},
	}
	for _, c := range cases {
		rec := &auditRecorder{}
		auditCheck(rec, c.entries, c.facts, policyOf, c.drained)
		assert.Contains(t, rec.errors.String(), c.want, "%s: what the audit reported", c.name)
	}
	// A clean history passes.
	rec := &auditRecorder{}
	f := facts("ta", "tb")
	f.releaseCalled["ta"] = true
	f.releaseCalled["tb"] = true
	auditCheck(rec, []auditEntry{
		entry(1, state(t0, nil, "a")),
		entry(2, state(t0, []ActiveSlot{slot("a", "ta", t0)})),
		entry(3, state(t0, []ActiveSlot{slot("a", "ta", t0)}, "b")),
		entry(4, state(t0, nil, "b")),
		entry(5, state(t0, []ActiveSlot{slot("b", "tb", t0)})),
		entry(6, nil),
	}, f, policyOf, true)
	assert.Empty(t, rec.errors.String(), "a clean history failed the audit")
}

// auditRecorder is a testing.TB that records errors instead of failing.
type auditRecorder struct {
	testing.TB
	errors bytes.Buffer
}

func (r *auditRecorder) Helper() {}

func (r *auditRecorder) Errorf(format string, args ...any) {
	fmt.Fprintf(&r.errors, format+"\n", args...)
}

func (r *auditRecorder) Fatalf(format string, args ...any) {
	fmt.Fprintf(&r.errors, format+"\n", args...)
}

// auditDeparture describes how job left the queue in the history: the
// first transition after which it is no longer queued, with the jobs that
// joined the queue and the slots that appeared in that same write. It
// returns the jobs that joined (a replacement) and a description.
func auditDeparture(entries []auditEntry, job string) (joined []string, desc string) {
	prev := map[string]*KeyState{}
	for _, e := range entries {
		p := prev[e.key]
		prev[e.key] = e.state
		if p == nil || !slices.ContainsFunc(p.Queued, func(q QueuedJob) bool { return q.JobID == job }) {
			continue
		}
		if e.state != nil && slices.ContainsFunc(e.state.Queued, func(q QueuedJob) bool { return q.JobID == job }) {
			continue
		}
		if e.state == nil {
			return nil, fmt.Sprintf("revision %d of %s deleted the key", e.rev, e.key)
		}
		for _, q := range e.state.Queued {
			if !slices.ContainsFunc(p.Queued, func(o QueuedJob) bool { return o.JobID == q.JobID }) {
				joined = append(joined, q.JobID)
			}
		}
		var slots []string
		for _, a := range e.state.Active {
			if !slices.ContainsFunc(p.Active, func(o ActiveSlot) bool { return o.SlotToken == a.SlotToken }) {
				slots = append(slots, a.JobID)
			}
		}
		return joined, fmt.Sprintf("revision %d of %s: queue %v -> %v, new slots for %v", e.rev, e.key,
			auditQueuedIDs(p.Queued), auditQueuedIDs(e.state.Queued), slots)
	}
	return nil, "it never left the queue"
}
