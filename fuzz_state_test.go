package jobkeys

import (
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// FuzzParseState compares ParseState with the independent checker of
// state_test.go, the TypeScript original's isJobKeyState over a JSON.parse
// reading of the document with the reader's deliberate differences
// (tsExpectState): both accept the same documents, and read the same
// content from them. Whatever ParseState accepts must also encode to a
// document the TypeScript original accepts, in its member order with
// toISOString timestamps, that parses back to the same value (a slot read
// without context gets one) and encodes to the same bytes.
//
// Seeds: the state vectors in testdata/states (copies of the shared
// vectors), the corpus in testdata/fuzz/FuzzParseState and the documents
// below. Run longer with
// go test -run '^$' -fuzz FuzzParseState -fuzztime 1m -fuzzminimizetime 2s .
// (minimizing a new input at the default 60 s stalls the run).
func FuzzParseState(f *testing.F) {
	names, err := filepath.Glob(filepath.Join("testdata", "states", "*.json"))
	require.NoError(f, err)
	require.NotEmpty(f, names, "no seeds in testdata/states")
	for _, name := range names {
		data, err := os.ReadFile(name)
		require.NoError(f, err)
		f.Add(data)
	}
	slot := `{"jobId":"x","slotToken":"t","instanceId":"w","startedAt":"2026-11-30T10:00:02.000Z",` +
		`"heartbeatAt":"2026-11-30t10:00:02z","leaseExpiresAt":"+010000-01-01T00:00:00.000Z","tries":1,` +
		`"context":{"requestId":"r","traceId":"t","traceparent":"p","TraceState":1}}`
	for _, seed := range []struct{ path, member string }{
		{"", `"active":[],"ACTIVE":[` + slot + `]`},
		{"", `"Active":[` + slot + `],"active":[` + slot + `]`},
		{"", `"maxActive":9007199254740993`},
		{"", `"maxQueuedPerKey":null`},
		{"", `"staleTakeoverCount":1e400`},
		{"", `"updatedAt":"2026-11-30T10:00:02.000+01:00"`},
		{"", `"updatedAt":"2026-02-30T10:00:02.000Z"`},
		{"", `"key":"a\ud800b\udc00"`},
		{"active[0]", `"context":null`},
		{"active[0]", `"JOBID":"a","jobId":"b"`},
		{"queued[0]", `"context":null`},
		{"queued[0].context", `"tracestate":null`},
		{"active[0].context", `"traceId":"","traceId":"x"`},
	} {
		f.Add(withMember(f, seed.path, seed.member, true))
	}
	f.Add(append([]byte("\xef\xbb\xbf"), readStateVector(f, "ts-two-queued.json")...))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseState(data)
		want, why := tsExpectState(data)
		if err != nil {
			require.Nil(t, s, "ParseState returned a state with error %v", err)
			require.NotEmpty(t, why, "ParseState refused what the checker accepts: %v\n%s", err, data)
			return
		}
		require.Empty(t, why, "ParseState accepted what the checker refuses\n%s", data)
		if utf8.Valid(data) {
			// (Elsewhere encoding/json and JavaScript replace invalid
			// UTF-8 differently; TestJSONStringDecoding covers that.)
			require.Equal(t, stringsView(want), stringsView(s), "ParseState read other content than the checker\n%s", data)
		}

		out := encodeState(t, s)
		checkWritten(t, out)
		back, err := ParseState(out)
		require.NoError(t, err, "ParseState accepted\n%s\nbut not its own encoding\n%s", data, out)
		exp := deepCopyState(s)
		require.Len(t, back.Active, len(exp.Active), "slots after a round trip")
		for i := range exp.Active {
			if exp.Active[i].Context.IsZero() {
				require.False(t, back.Active[i].Context.IsZero(), "slot %d written back without context", i)
				exp.Active[i].Context = back.Active[i].Context
			}
		}
		require.Equal(t, normState(exp), normState(back), "parse(encode(parse(doc))) != parse(doc)")
		require.Equal(t, string(out), string(encodeState(t, back)), "encoding is not stable")
	})
}

// fuzzJobs are the job ids the reducer programs work on.
var fuzzJobs = []string{"j0", "j1", "j2", "j3", "j4", "j5"}

// fuzzSteps are the clock advances an operation byte can pick (TTL 10s).
var fuzzSteps = []time.Duration{0, 0, 0, time.Millisecond, 1500 * time.Microsecond, 500 * time.Millisecond,
	time.Second, 5 * time.Second, 9999 * time.Millisecond, 10 * time.Second, 10001 * time.Millisecond, 20 * time.Second,
	0, 250 * time.Microsecond, 3 * time.Second, 0}

// FuzzReducers decodes its input into a policy and a sequence of operations
// on a few job ids, applies them through the reducers (as the coordinator
// would, deleting an emptied state), and checks after each: the input
// state is not mutated nor aliased; the outcome is the TS original's
// (tsReduce* in reducers_test.go) except where a deliberate fix applies,
// which is checked on its own; every job is accounted for (nothing queued
// or running disappears without an outcome saying so); never more slots
// than MaxActive, no job twice, the queue within MaxQueuedPerKey+MaxActive;
// and the state encodes to what the TS original accepts.
func FuzzReducers(f *testing.F) {
	for b0 := range 18 {
		rng := mrand.New(mrand.NewPCG(uint64(b0), 42))
		prog := []byte{byte(b0), byte(b0 / 2)}
		for range 120 {
			prog = append(prog, byte(rng.IntN(256)))
		}
		f.Add(prog)
	}
	// A job's lease lapses and another takes the slot over; the first
	// renews (lost) and releases (stale completion), then retries.
	f.Add([]byte{0, 1, 0x00, 0, 0x03, 0, 0x00, 1, 0xb3, 1, 0x06, 0, 0x09, 0, 0x05, 0})
	// Replace-oldest with immediate restores.
	f.Add([]byte{12, 0, 0x00, 0, 0x03, 0, 0x00, 1, 0x00, 2, 0x0d, 0, 0x00, 3, 0x0d, 0, 0x0c, 1})
	f.Fuzz(func(t *testing.T, data []byte) { runReducerProgram(t, data) })
}

func runReducerProgram(t *testing.T, data []byte) {
	next := func() byte {
		if len(data) == 0 {
			return 0
		}
		b := data[0]
		data = data[1:]
		return b
	}
	b0, b1 := next(), next()
	policy := mustPolicy(t, Policy{
		MaxActive:         1 + int(b0%3),
		StalePolicy:       []StalePolicy{FailStale, Block}[(b0/3)%2],
		WhenFull:          []WhenFull{Reject, Coalesce, ReplaceOldest}[(b0/6)%3],
		MaxQueuedPerKey:   int(b1 % 4),
		HeartbeatInterval: time.Second,
		HeartbeatTTL:      10 * time.Second,
	})
	var (
		state        *KeyState
		now          = rt0
		leases       = map[string][]Lease{}
		lastReplaced *ReplacedJob // set only by the operation just before
		lastNewJob   string
		tokens       int
	)
	for step := 0; len(data) > 0 && step < 400; step++ {
		op, arg := next(), next()
		now = now.Add(fuzzSteps[op>>4])
		job := fuzzJobs[int(arg)%len(fuzzJobs)]
		replaced, newJob := lastReplaced, lastNewJob
		lastReplaced, lastNewJob = nil, ""
		in := state
		before := deepCopyState(in)
		what := ""
		var out *KeyState

		switch kind := op & 15; {
		case kind <= 2 || (kind == 13 && replaced == nil):
			strict := kind == 2
			what = fmt.Sprintf("admit %s strict=%v", job, strict)
			req := AdmitRequest{JobID: job, Context: rctx(job), StrictCreate: strict}
			got := ReduceAdmission(in, rtKey, req, policy, now)
			out = got.State
			checkAdmission(t, what, in, got, tsReduceAdmission(deepCopyState(in), rtKey, req, policy, now), job)
			if got.Kind == KindReplaced {
				lastReplaced, lastNewJob = got.Replaced, job
			}
		case kind == 13:
			what = fmt.Sprintf("restore %s replaced by %s", replaced.ID, newJob)
			req := RestoreRequest{ReplacementJobID: newJob, Replaced: *replaced}
			got := ReduceRestoreReplaced(in, rtKey, req, policy, now)
			out = got.State
			ts := tsReduceRestoreReplaced(deepCopyState(in), rtKey, req, policy, now)
			if got.State == nil {
				require.Equal(t, normState(rwith(in, func(s *KeyState) { s.UpdatedAt = jsNow(now) })), normState(ts.State),
					"%s: Go wrote nothing but the TS original changes more than updatedAt", what)
			} else {
				require.Equal(t, normState(ts.State), normState(got.State), "%s: differs from the TS original", what)
			}
			if out != nil {
				require.Equal(t, withoutID(withID(queuedSet(in), replaced.ID, !activeSet(in)[replaced.ID]), newJob), queuedSet(out), "%s: queue", what)
			}
		case kind <= 5 || kind == 14:
			retry := kind == 5
			if kind == 14 {
				now = now.Add(time.Duration(arg%7) * 100 * time.Microsecond)
			}
			tokens++
			tok := fmt.Sprintf("tok-%d", tokens)
			what = fmt.Sprintf("acquire %s retry=%v", job, retry)
			req := AcquireRequest{JobID: job, Context: rctx(job), Retry: retry, Tries: 1, InstanceID: "w"}
			got := ReduceAcquire(in, rtKey, req, policy, now, tok)
			out = got.State
			checkAcquisition(t, what, in, got, tsReduceAcquire(deepCopyState(in), rtKey, req, policy, now, tok), job, policy, now)
			if got.Kind == KindAcquired {
				leases[job] = append(leases[job], got.Lease)
			}
		case kind <= 11:
			var lease Lease
			switch hist := leases[job]; {
			case (kind == 8 || kind == 11) && len(hist) > 1:
				lease = hist[int(arg)%(len(hist)-1)] // an earlier lease
			case len(hist) > 0 && kind != 8 && kind != 11:
				lease = hist[len(hist)-1]
			default:
				lease = Lease{JobID: job, SlotToken: "never-issued", Policy: policy}
			}
			if kind <= 8 {
				what = fmt.Sprintf("renew %s %s", job, lease.SlotToken)
				got := ReduceRenew(in, lease, now)
				out = got.State
				ts := tsReduceRenew(deepCopyState(in), lease.JobID, lease.SlotToken, now, lease.Policy)
				require.Equal(t, ts.Kind, got.Kind, what)
				require.Equal(t, normState(ts.State), normState(got.State), "%s: differs from the TS original", what)
				if out != nil {
					require.Equal(t, activeSet(in), activeSet(out), what)
				}
			} else {
				what = fmt.Sprintf("release %s %s", job, lease.SlotToken)
				got := ReduceRelease(in, lease, now)
				out = got.State
				ts := tsReduceRelease(deepCopyState(in), lease.JobID, lease.SlotToken, now)
				require.Equal(t, ts.Kind, got.Kind, what)
				require.Equal(t, normState(ts.State), normState(got.State), "%s: differs from the TS original", what)
				if out != nil {
					require.Equal(t, withoutID(activeSet(in), job), activeSet(out), what)
				}
			}
		case kind == 12:
			what = "remove " + job
			got := ReduceRemoveQueued(in, job, now)
			out = got.State
			ts := tsReduceRemoveQueued(deepCopyState(in), job, now)
			require.Equal(t, ts.Kind, got.Kind, what)
			require.Equal(t, normState(ts.State), normState(got.State), "%s: differs from the TS original", what)
		default: // 15: the clock moves, nothing else
			continue
		}

		what = fmt.Sprintf("step %d (%s at +%v)", step, what, now.Sub(rt0))
		require.Equal(t, before, in, "%s: the reducer mutated its input", what)
		checkNoAlias(t, in, out)
		if out == nil {
			continue
		}
		checkInvariants(t, what, out, policy, now)
		if out.Empty() {
			state = nil // the coordinator deletes it
		} else {
			state = out
		}
	}
}

func checkAdmission(t *testing.T, what string, in *KeyState, got, ts Admission, job string) {
	t.Helper()
	if queuedSet(in)[job] || activeSet(in)[job] { // fix 1
		require.True(t, got.Kind == KindAccepted && got.AlreadyPresent && got.State == nil,
			"%s: a job already present must be accepted without a write: %+v", what, got)
		return
	}
	require.True(t, !got.AlreadyPresent, "%s: AlreadyPresent for a new job", what)
	require.Equal(t, viewAdmission(ts), viewAdmission(got), "%s: differs from the TS original", what)
	switch got.Kind {
	case KindAccepted:
		require.Equal(t, withID(queuedSet(in), job, true), queuedSet(got.State), "%s: queue", what)
	case KindReplaced:
		require.Equal(t, withID(withoutID(queuedSet(in), got.Replaced.ID), job, true), queuedSet(got.State), "%s: queue", what)
	}
}

func checkAcquisition(t *testing.T, what string, in *KeyState, got, ts Acquisition, job string, p Policy, now time.Time) {
	t.Helper()
	now = jsNow(now)
	var own []ActiveSlot
	expired := 0
	if in != nil {
		for _, s := range in.Active {
			if s.JobID == job {
				own = append(own, s)
			}
			if !s.LeaseExpiresAt.After(now) {
				expired++
			}
		}
	}
	switch {
	case len(own) > 0: // fix 2
		live := false
		for _, s := range own {
			live = live || s.LeaseExpiresAt.After(now)
		}
		if live {
			require.True(t, got.Kind == KindBlocked && got.Reason == ReasonAlreadyActive, "%s: a job with a live slot got %s/%s", what, got.Kind, got.Reason)
		}
		for _, s := range got.Stale {
			require.True(t, s.JobID != job, "%s: the job's own slot reported stale", what)
		}
	case p.StalePolicy == Block && expired > 0 && got.Kind == KindAcquired && ts.Kind == KindAcquired: // fix 3
		require.Equal(t, in.StaleTakeoverCount, got.State.StaleTakeoverCount, "%s: under Block nothing is taken over", what)
		tsv := viewAcquisition(ts)
		tsv.State.StaleTakeoverCount = got.State.StaleTakeoverCount
		require.Equal(t, tsv, viewAcquisition(got), "%s: differs from the TS original beyond the stale count", what)
	default:
		require.Equal(t, viewAcquisition(ts), viewAcquisition(got), "%s: differs from the TS original", what)
	}
	if got.Kind != KindAcquired {
		require.True(t, got.State == nil, "%s: a blocked outcome carries a state", what)
		return
	}
	// Accounting: the slots that went are the reported stale ones and the
	// job's own; the job left the queue.
	wantActive := activeSet(in)
	for _, s := range got.Stale {
		require.True(t, !s.LeaseExpiresAt.After(now), "%s: reported a live slot as stale", what)
		delete(wantActive, s.JobID)
	}
	wantActive[job] = true
	require.Equal(t, wantActive, activeSet(got.State), "%s: active jobs", what)
	require.Equal(t, withoutID(queuedSet(in), job), queuedSet(got.State), "%s: queue", what)
	taken := len(got.Stale) + len(own)
	if in != nil {
		require.Equal(t, in.StaleTakeoverCount+taken, got.State.StaleTakeoverCount, "%s: stale takeover count", what)
	}
	require.Equal(t, got.Lease.SlotToken, got.State.Active[len(got.State.Active)-1].SlotToken, "%s: the new slot is last", what)
}

func checkInvariants(t *testing.T, what string, s *KeyState, p Policy, now time.Time) {
	t.Helper()
	now = jsNow(now)
	live := 0
	for _, a := range s.Active {
		if a.LeaseExpiresAt.After(now) {
			live++
		}
	}
	require.True(t, live <= p.MaxActive, "%s: %d live slots, MaxActive %d", what, live, p.MaxActive)
	require.True(t, len(s.Active) <= p.MaxActive, "%s: %d slots, MaxActive %d", what, len(s.Active), p.MaxActive)
	require.True(t, len(s.Queued) <= p.MaxQueuedPerKey+p.MaxActive, "%s: %d queued, limit %d", what, len(s.Queued), p.MaxQueuedPerKey+p.MaxActive)
	ids := append(activeJobIDs(s), queuedIDs(s)...)
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	require.Equal(t, len(sorted), len(slices.Compact(sorted)), "%s: a job appears twice in %v", what, ids)
	require.Equal(t, jsNow(now), s.UpdatedAt, "%s: updatedAt", what)
	require.Equal(t, rtKey.KeyHash, s.KeyHash, what)
	require.Equal(t, p.MaxActive, s.MaxActive, what)
	out := encodeState(t, s)
	checkWritten(t, out)
	back, err := ParseState(out)
	require.NoError(t, err, what)
	require.Equal(t, normState(s), normState(back), "%s: round trip", what)
}

func activeSet(s *KeyState) map[string]bool {
	m := map[string]bool{}
	if s != nil {
		for _, a := range s.Active {
			m[a.JobID] = true
		}
	}
	return m
}

func queuedSet(s *KeyState) map[string]bool {
	m := map[string]bool{}
	if s != nil {
		for _, q := range s.Queued {
			m[q.JobID] = true
		}
	}
	return m
}

func withID(m map[string]bool, id string, add bool) map[string]bool {
	if add {
		m[id] = true
	}
	return m
}

func withoutID(m map[string]bool, id string) map[string]bool {
	delete(m, id)
	return m
}

// FuzzDecodeStateDifferential compares decodeState, the single-pass
// decoder, with refDecodeState, the decoder it replaced
// (state_decode_ref_test.go): on any bytes both accept or both refuse, with
// the same error message (and both wrapping jsjson.ErrTooDeep or neither), and
// what they accept they read as the same KeyState, field for field.
//
// Seeds: the state vectors in testdata/states, the corpus of
// FuzzParseState, the member seeds of FuzzParseState and states mutated
// byte by byte (stateDecodeSeeds). Run longer with
// go test -run '^$' -fuzz FuzzDecodeStateDifferential -fuzztime 1m -fuzzminimizetime 2s .
func FuzzDecodeStateDifferential(f *testing.F) {
	for _, seed := range stateDecodeSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) { requireDecodersAgree(t, data) })
}

// requireDecodersAgree checks that decodeState reads data as refDecodeState
// does.
func requireDecodersAgree(t testing.TB, data []byte) {
	t.Helper()
	want, wantErr := refDecodeState(data)
	got, err := decodeState(data)
	if wantErr != nil {
		require.Error(t, err, "decodeState accepted what the old decoder refuses (%v)\n%q", wantErr, data)
		require.Nil(t, got, "decodeState returned a state with its error")
		require.Equal(t, wantErr.Error(), err.Error(), "decodeState's error differs from the old decoder's\n%q", data)
		require.Equal(t, errors.Is(wantErr, jsjson.ErrTooDeep), errors.Is(err, jsjson.ErrTooDeep), "jsjson.ErrTooDeep is wrapped by one error only")
		return
	}
	require.NoError(t, err, "decodeState refused what the old decoder accepts\n%q", data)
	require.Equal(t, want, got, "decodeState read other content than the old decoder\n%q", data)
}

// stateDecodeSeeds returns documents for the decoder comparisons: the state
// vectors, FuzzParseState's corpus and member seeds, a benchmark state,
// documents nested at the depth limit, and a sample of one-byte mutations
// of a vector.
func stateDecodeSeeds(t testing.TB) [][]byte {
	t.Helper()
	var seeds [][]byte
	for _, name := range stateVectorNames(t) {
		seeds = append(seeds, readStateVector(t, name))
	}
	corpus, err := filepath.Glob(filepath.Join("testdata", "fuzz", "FuzzParseState", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, corpus, "no corpus in testdata/fuzz/FuzzParseState")
	for _, name := range corpus {
		seeds = append(seeds, readCorpusBytes(t, name))
	}
	slot := `{"jobId":"x","slotToken":"t","instanceId":"w","startedAt":"2026-11-30T10:00:02.000Z",` +
		`"heartbeatAt":"2026-11-30t10:00:02z","leaseExpiresAt":"+010000-01-01T00:00:00.000Z","tries":1,` +
		`"context":{"requestId":"r","traceId":"t","traceparent":"p","TraceState":1}}`
	for _, seed := range []struct{ path, member string }{
		{"", `"active":[],"ACTIVE":[` + slot + `]`},
		{"", `"Active":[` + slot + `],"active":[` + slot + `]`},
		{"", `"active":[` + slot + `,1,{}]`},
		{"", `"queued":[1]`},
		{"", `"maxActive":9007199254740993`},
		{"", `"maxActive":1.0e0`},
		{"", `"maxQueuedPerKey":null`},
		{"", `"staleTakeoverCount":1e400`},
		{"", `"staleTakeoverCount":-0`},
		{"", `"version":"1"`},
		{"", `"upd\u0061tedAt":"2026-11-30T10:00:02.000+01:00"`},
		{"", `"updatedAt":"2026-02-30T10:00:02.000Z"`},
		{"", `"updatedAt":"\u0032026-11-30T10:00:02.000Z"`},
		{"", `"key":"a\ud800b\udc00\u00e9\n\/"`},
		{"", `"x":{"a":[1,true,false,null,"s",{"b":[]},-1.5e+3]}`},
		{"active[0]", `"context":null`},
		{"active[0]", `"context":{"requestId":"a","traceId":"b","traceparent":"c"},"context":"x"`},
		{"active[0]", `"JOBID":"a","jobId":"b"`},
		{"active[0]", `"tries":1.5`},
		{"queued[0]", `"context":null`},
		{"queued[0]", `"requestId":""`},
		{"queued[0].context", `"tracestate":null`},
		{"queued[0].context", `"tracestate":"k=v"`},
		{"active[0].context", `"traceId":"","traceId":"x"`},
	} {
		seeds = append(seeds, withMember(t, seed.path, seed.member, true), withMember(t, seed.path, seed.member, false))
	}
	seeds = append(seeds, append([]byte("\xef\xbb\xbf"), readStateVector(t, "ts-two-queued.json")...))
	seeds = append(seeds, benchStateBytes(t, 3))
	for _, depth := range []int{MaxPayloadDepth - 1, MaxPayloadDepth} {
		seeds = append(seeds, withMember(t, "active[0].context", `"x":`+strings.Repeat("[", depth-3)+strings.Repeat("]", depth-3), true))
	}
	doc := withMember(t, "", `"x":0`, true)
	for i := 0; i < len(doc); i += 23 {
		for _, c := range []byte("\"\\{}[],:0e- \x80") {
			seeds = append(seeds, slices.Concat(doc[:i], []byte{c}, doc[i+1:]))
		}
		seeds = append(seeds, slices.Concat(doc[:i], doc[i+1:]), doc[:i])
	}
	return seeds
}

// readCorpusBytes reads the []byte value of a one-value fuzz corpus file.
func readCorpusBytes(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(name)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Len(t, lines, 2, "%s: want a header and one value", name)
	lit, ok := strings.CutPrefix(lines[1], "[]byte(")
	require.True(t, ok, "%s: not a []byte value", name)
	s, err := strconv.Unquote(strings.TrimSuffix(lit, ")"))
	require.NoError(t, err, "%s", name)
	return []byte(s)
}
