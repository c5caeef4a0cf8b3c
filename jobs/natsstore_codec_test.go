package jobs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/internal/kvstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// natsSeedRecords are valid stored records of jobs in several states.
func natsSeedRecords(t testing.TB) [][]byte {
	t.Helper()
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	pending := Job{
		ID: "job-1", ChannelID: "ch", Type: "render", Version: 1, Origin: "user", TargetKey: "doc",
		TargetGeneration: 1, IdempotencyKey: "k", Fingerprint: "f", Input: json.RawMessage(`{"n":1}`),
		State: StatePending, AvailableAt: now, CreatedAt: now, UpdatedAt: now,
	}
	running := pending
	running.State, running.Attempts, running.ClaimGeneration = StateRunning, 1, 1
	running.ClaimOwner, running.ClaimExpiresAt = "w", now.Add(time.Minute)
	running.ClaimBinding = json.RawMessage(`{"slot":"s"}`)
	running.Progress = []Progress{
		{Revision: 3, Attempt: 1, Stage: "fetch", Label: "fetching", State: ProgressCompleted, CreatedAt: now},
		{Attempt: 1, Stage: "parse", Label: "parsing", State: ProgressInterrupted, Reason: "timeout", CreatedAt: now},
	}
	completed := pending
	completed.State, completed.Attempts, completed.ClaimGeneration = StateCompleted, 1, 1
	var out [][]byte
	for _, c := range []struct {
		j   Job
		art *Artifact
	}{
		{pending, nil}, {running, nil},
		{completed, &Artifact{JobID: "job-1", Value: json.RawMessage(`{"ok":true}`), CreatedAt: now}},
		{completed, &Artifact{JobID: "job-1", Revision: 4, CreatedAt: now}},
	} {
		b, err := encodeNATSJob(&c.j, c.art, 0)
		require.NoError(t, err)
		out = append(out, b)
	}
	return out
}

// FuzzNATSJobRecord feeds the stored-value decoder arbitrary bytes: it
// never panics, and what it accepts is a valid job that encodes and decodes
// to itself.
func FuzzNATSJobRecord(f *testing.F) {
	for _, b := range natsSeedRecords(f) {
		f.Add(b, uint64(7))
	}
	f.Add([]byte(`{"v":1}`), uint64(1))
	f.Add([]byte(`{"v":1,"state":"running"}`), uint64(1))
	f.Add([]byte(`null`), uint64(1))
	f.Add([]byte(``), uint64(0))
	f.Fuzz(func(t *testing.T, data []byte, rev uint64) {
		const key = "job.ch.job-1"
		j, art, activeSeq, err := decodeNATSJobMeta(key, rev, data, "ch", "job-1")
		if err != nil {
			require.ErrorIs(t, err, ErrCorrupt)
			require.Contains(t, err.Error(), key)
			return
		}
		require.NoError(t, validateJob(&j))
		assert.Equal(t, rev, j.Revision)
		again, err := encodeNATSJobMeta(&j, art, natsMeta{revOffset: j.Revision - rev, activeSeq: activeSeq})
		require.NoError(t, err)
		j2, art2, activeSeq2, err := decodeNATSJobMeta(key, rev, again, "ch", "job-1")
		require.NoError(t, err)
		assert.Equal(t, activeSeq, activeSeq2)
		assert.Equal(t, j, j2)
		assert.Equal(t, art, art2)
	})
}

func TestNATSJobRecordPlaceholders(t *testing.T) {
	recs := natsSeedRecords(t)
	j, _, err := decodeNATSJob("k", 9, recs[1], "ch", "job-1")
	require.NoError(t, err)
	require.Len(t, j.Progress, 2)
	assert.Equal(t, uint64(3), j.Progress[0].Revision, "a stored revision stays")
	assert.Equal(t, uint64(9), j.Progress[1].Revision, "the placeholder takes the entry's revision")
	_, art, err := decodeNATSJob("k", 9, recs[2], "ch", "job-1")
	require.NoError(t, err)
	require.NotNil(t, art)
	assert.Equal(t, uint64(9), art.Revision)
	_, art, err = decodeNATSJob("k", 9, recs[3], "ch", "job-1")
	require.NoError(t, err)
	assert.Nil(t, art.Value, "a null artifact stays nil")
	_, _, err = decodeNATSJob("k", 2, recs[1], "ch", "job-1")
	assert.ErrorIs(t, err, ErrCorrupt, "a progress entry from a later revision than the record's")
}

// TestNATSJobRecordMarks decodes the marks and the revision an unbatched
// enqueue writes (natsstore_enqueue.go), and refuses the records no
// enqueue writes: a staged job that is not pending or is marked too, a
// supersede mark on a finished job, a revision past the entry's.
func TestNATSJobRecordMarks(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	j := Job{ID: "job-1", ChannelID: "ch", Type: "render", Version: 1, TargetKey: "doc", TargetGeneration: 2,
		IdempotencyKey: "i", Fingerprint: "f", State: StatePending, AvailableAt: at, CreatedAt: at, UpdatedAt: at}
	decode := func(j Job, meta natsMeta, rev uint64) (Job, natsMarks, error) {
		t.Helper()
		b, err := encodeNATSJobMeta(&j, nil, meta)
		require.NoError(t, err)
		got, _, _, marks, err := decodeNATSJobStaged("k", rev, b, "ch", "job-1")
		return got, marks, err
	}
	got, marks, err := decode(j, natsMeta{staged: &natsStaged{Prev: "job-0"}}, 9)
	require.NoError(t, err)
	require.NotNil(t, marks.staged)
	assert.Equal(t, "job-0", marks.staged.Prev)
	assert.Nil(t, marks.supersede)
	assert.Equal(t, uint64(9), got.Revision)

	got, marks, err = decode(j, natsMeta{supersede: &natsSupersede{At: at}, revision: 7}, 9)
	require.NoError(t, err)
	require.NotNil(t, marks.supersede)
	assert.True(t, marks.supersede.At.Equal(at))
	assert.Equal(t, uint64(7), got.Revision, "the revision written beats the entry's")
	assert.False(t, (natsMarks{}).any())

	running := j
	running.State, running.ClaimOwner, running.ClaimGeneration, running.ClaimExpiresAt, running.Attempts = StateRunning, "w", 1, at, 1
	_, _, err = decode(running, natsMeta{staged: &natsStaged{}}, 9)
	assert.ErrorIs(t, err, ErrCorrupt, "a staged running job")
	assert.ErrorContains(t, err, "staged record in state running")
	_, _, err = decode(j, natsMeta{staged: &natsStaged{}, supersede: &natsSupersede{At: at}}, 9)
	assert.ErrorIs(t, err, ErrCorrupt, "a staged job marked superseded too")
	done := j
	done.State = StateCancelled
	_, _, err = decode(done, natsMeta{supersede: &natsSupersede{At: at}}, 9)
	assert.ErrorIs(t, err, ErrCorrupt, "a supersede mark on a finished job")
	assert.ErrorContains(t, err, "supersede mark on a cancelled job")
	_, _, err = decode(j, natsMeta{revision: 10}, 9)
	assert.ErrorIs(t, err, ErrCorrupt, "a revision past the entry's")
	_, _, err = decode(j, natsMeta{revision: 5, revOffset: 1}, 9)
	assert.ErrorIs(t, err, ErrCorrupt, "a revision with an offset")
}

// FuzzNATSToken checks the id escape: it round-trips, never yields a
// separator or wildcard, and two ids never share a token.
func FuzzNATSToken(f *testing.F) {
	for _, s := range []string{"a", "a.b", "a=2Eb", "*", ">", " ", "ü", "A_b-9", "=", "=3D"} {
		f.Add(s, s+".")
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		ta, tb := escapeToken(a), escapeToken(b)
		assert.False(t, strings.ContainsAny(ta, ".*> \t\r\n"), "token %q", ta)
		back, err := unescapeToken(ta)
		require.NoError(t, err)
		assert.Equal(t, a, back)
		assert.Equal(t, a == b, ta == tb, "ids %q and %q, tokens %q and %q", a, b, ta, tb)
		assert.LessOrEqual(t, len(ta), 3*len(a))
	})
}

func TestNATSKeysStayUnderTheControlLine(t *testing.T) {
	long := strings.Repeat("\xff", IdentifierSizeLimit)
	k := natsKeys{prefix: "$KV." + strings.Repeat("B", 64) + "."}
	for _, key := range []string{
		k.job(long, long), k.idem(long, long), k.target(long, long), k.active(long, long),
		k.list(long, time.Now(), long),
	} {
		// HPUB <subject> <reply> <hdr> <total>: the subject and an inbox
		// reply must fit 4 KiB with room to spare.
		assert.Less(t, len(k.subject(key)), 2048, key[:20])
	}
	created := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	lch, at, id, err := parseList(k.list("c.h", created, "a.b"))
	require.NoError(t, err)
	assert.Equal(t, "c.h", lch)
	assert.Equal(t, created, at)
	assert.Equal(t, "a.b", id)
	_, _, _, err = parseList(k.subject(k.list("ch", created, "a.b")))
	assert.Error(t, err, "a subject is not a key")
	ch, id, err := parseActive(k.active("c.h", "j*"))
	require.NoError(t, err)
	assert.Equal(t, []string{"c.h", "j*"}, []string{ch, id})
}

// natsRecordOf is a record of the seed's shape with the given strings, raw
// values and time in every field of their kind.
func natsRecordOf(s, u string, raw []byte, at time.Time, n uint64) natsJobRecord {
	r := natsJobRecord{
		V: 1, RevisionOffset: n % 3, ActiveSeq: n, ActiveOffset: n % 2, ID: s, ChannelID: u, Type: s, Version: int(n % 1000),
		Origin: u, TargetKey: s, TargetGeneration: n, IdempotencyKey: u, Fingerprint: s, Input: raw,
		State: State(u), Attempts: int(n % 7), Failures: int(n % 5), ClaimGeneration: n, ClaimOwner: s,
		ClaimBinding: raw, ClaimExpiresAt: at, AvailableAt: at, Reason: u, CreatedAt: at, UpdatedAt: at,
		Progress: []natsProgress{
			{Revision: n, Attempt: 1, Stage: s, Label: u, State: ProgressState(s), Reason: u, CreatedAt: at},
			{Attempt: 2, Stage: u, Label: s, State: ProgressStarted, CreatedAt: at},
		},
	}
	if n%2 == 0 {
		r.Artifact = &natsArtifactValue{Revision: n / 2, Value: raw, CreatedAt: at}
	}
	return r
}

// FuzzNATSRecordEncode checks the hand-written encoder against
// encoding/json, which defines the format: whatever it writes is byte for
// byte what json.Marshal writes.
func FuzzNATSRecordEncode(f *testing.F) {
	f.Add("job-1", "ch", []byte(`{"n":1}`), int64(1772600767), int64(5), 0, uint64(4))
	f.Add("a<b", "ü\u2028", []byte(`{"a": 1}`), int64(-62135596801), int64(0), 3600, uint64(1))
	f.Add("x\xff", "\"q\\", []byte(`"\u003c"`), int64(253402300800), int64(999999999), -5400, uint64(0))
	f.Add("", "", []byte(nil), int64(0), int64(0), 86400*2, uint64(1<<63))
	f.Add("s p", "é", []byte(`[1,{"s":"a b"},null,true,-1.5e3]`), int64(1), int64(100), 59, uint64(3))
	f.Add("ok", "ok", []byte(``), int64(1), int64(1), 0, uint64(2))
	f.Fuzz(func(t *testing.T, s, u string, raw []byte, sec, nsec int64, off int, n uint64) {
		at := time.Unix(sec, nsec).In(time.FixedZone("z", off))
		// The marks and revision of an unbatched enqueue's records
		// (natsstore_enqueue.go).
		marked := natsRecordOf(s, u, raw, at, n)
		marked.Revision, marked.Staged = n/2, &natsStaged{Prev: u}
		superseding := natsRecordOf(u, s, raw, at, n)
		superseding.Revision, superseding.Supersede = n, &natsSupersede{At: at}
		for _, r := range []natsJobRecord{natsRecordOf(s, u, raw, at, n), natsRecordOf(u, s, nil, time.Unix(sec, 0).UTC(), n+1), marked, superseding} {
			want, err := json.Marshal(&r)
			got, ok := appendNATSRecord(nil, &r)
			if ok {
				require.NoError(t, err, "the encoder wrote what json.Marshal refuses")
				require.Equal(t, string(want), string(got))
			}
		}
		idem := natsIdemRecord{JobID: s, Fingerprint: u}
		if got, ok := appendNATSIdem(nil, idem); ok {
			want, err := json.Marshal(idem)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))
		}
		target := natsTargetRecord{Generation: n, JobID: s}
		if got, ok := appendNATSTarget(nil, target); ok {
			want, err := json.Marshal(target)
			require.NoError(t, err)
			require.Equal(t, string(want), string(got))
		}
	})
}

// FuzzNATSRecordFastPath checks the hand-written decoder against
// encoding/json: whatever it accepts, encoding/json decodes to the same
// record.
func FuzzNATSRecordFastPath(f *testing.F) {
	for _, b := range natsSeedRecords(f) {
		f.Add(b)
		f.Add(bytes.Replace(b, []byte(`"render"`), []byte(`"r\u00e9nder"`), 1))
		f.Add(bytes.Replace(b, []byte(`{"n":1}`), []byte(`{"n": 1}`), 1))
		f.Add(bytes.Replace(b, []byte(`"attempts":1`), []byte(`"attempts":01`), 1))
		f.Add(append(b, ' '))
	}
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, ok := parseNATSRecord(data, "ch", "job-1")
		want, err := unmarshalNATSRecord(data)
		if !ok {
			return
		}
		require.NoError(t, err, "the fast path accepted what encoding/json refuses")
		require.Equal(t, want, got)
	})
}

// TestNATSRecordFastPathTaken checks that the records the store writes take
// the hand-written paths both ways (else the benchmarks measure
// encoding/json), and that the records json.Marshal writes, as the store
// did before those paths, decode the same through either.
func TestNATSRecordFastPathTaken(t *testing.T) {
	at := time.Date(2026, 3, 4, 5, 6, 7, 890, time.UTC)
	for i, r := range []natsJobRecord{
		natsRecordOf("job-1", "ch", []byte(`{"n":[1,"a b",{"c":null}]}`), at, 4),
		natsRecordOf("job-1", "ch", []byte(`"x"`), at, 3),
		natsRecordOf("ü-é", "ch", []byte(`{"n":1}`), at.In(time.FixedZone("", -3600)), 2),
	} {
		b, ok := appendNATSRecord(nil, &r)
		require.True(t, ok, "record %d takes the encoder's fallback", i)
		main, err := json.Marshal(&r)
		require.NoError(t, err)
		require.Equal(t, string(main), string(b), "record %d", i)
		got, ok := parseNATSRecord(b, "ch", "job-1")
		require.True(t, ok, "record %d takes the decoder's fallback: %s", i, b)
		want, err := unmarshalNATSRecord(b)
		require.NoError(t, err)
		require.Equal(t, want, got, "record %d", i)
	}
	for _, b := range natsSeedRecords(t) {
		_, ok := parseNATSRecord(b, "ch", "job-1")
		require.True(t, ok, "%s", b)
	}
	// What the fast paths leave to encoding/json still round-trips.
	odd := natsRecordOf("a<b>&\"\\\x01", "\xff\u2028", []byte(`{"a" : "<b>"}`), time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("", 1)), 2)
	_, ok := appendNATSRecord(nil, &odd)
	require.False(t, ok)
	b, err := json.Marshal(&odd)
	require.NoError(t, err)
	_, ok = parseNATSRecord(b, "", "")
	require.False(t, ok)
	want, err := unmarshalNATSRecord(b)
	require.NoError(t, err)
	assert.Equal(t, `{"a":"\u003cb\u003e"}`, string(want.Input))
	assert.Equal(t, "\ufffd\u2028", want.ChannelID)
}

// TestNATSRequestBodies checks the hand-written API request bodies against
// what the server reads from them, for subjects they write as they are and
// for those they leave to encoding/json.
func TestNATSRequestBodies(t *testing.T) {
	for _, subj := range []string{"$KV.B.active.ch.>", "$KV.B.*.c=2Eh.>", "$KV.B.job.ch.j-1_x", "a\"b\\c\x01ü"} {
		b, err := kvstream.LastBySubjectRequest(subj)
		require.NoError(t, err)
		var last struct {
			LastBySubj string `json:"last_by_subj"`
		}
		require.NoError(t, json.Unmarshal(b, &last), "%s", b)
		assert.Equal(t, subj, last.LastBySubj)

		b, err = natsMultiLastBody([]string{subj, "$KV.B.job.a.b"}, 1<<20)
		require.NoError(t, err)
		var multi struct {
			MultiLast []string `json:"multi_last"`
			MaxBytes  int      `json:"max_bytes"`
		}
		require.NoError(t, json.Unmarshal(b, &multi), "%s", b)
		assert.Equal(t, []string{subj, "$KV.B.job.a.b"}, multi.MultiLast)
		assert.Equal(t, 1<<20, multi.MaxBytes)

		b, err = natsPurgeBody(subj, 1<<60)
		require.NoError(t, err)
		var purge struct {
			Filter string `json:"filter"`
			Seq    uint64 `json:"seq"`
		}
		require.NoError(t, json.Unmarshal(b, &purge), "%s", b)
		assert.Equal(t, subj, purge.Filter)
		assert.Equal(t, uint64(1<<60), purge.Seq)
	}
}

// TestNATSListKeyTime checks the list key's creation token: Unix
// nanoseconds as 16 lowercase hex digits, as stored by every earlier
// version ("%016x"), before 1970 too.
func TestNATSListKeyTime(t *testing.T) {
	k := natsKeys{prefix: "$KV.B."}
	for _, at := range []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC), time.Unix(0, 0), time.Unix(0, -1),
		time.Date(1900, 1, 1, 0, 0, 0, 0, time.UTC), time.Unix(0, 0x0123456789abcdef),
	} {
		want := "list.ch." + fmt.Sprintf("%016x", uint64(at.UnixNano())) + ".j"
		assert.Equal(t, want, k.list("ch", at, "j"))
		_, back, _, err := parseList(want)
		require.NoError(t, err)
		assert.True(t, at.Equal(back), "%v", at)
	}
	assert.Equal(t, "list.c=2Eh.0000000000000001.a=2Eb", k.list("c.h", time.Unix(0, 1), "a.b"))
	_, _, _, err := parseList("list.ch.0000000000000001.j.x")
	assert.Error(t, err, "a key with a token too many")
	_, _, err = parseActive("active.ch")
	assert.Error(t, err, "a key with a token too few")
	_, _, err = parseActive("active.ch.j.x")
	assert.Error(t, err, "a key with a token too many")
}
