package jobs

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

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
	at, id, err := parseList(k.list("ch", created, "a.b"))
	require.NoError(t, err)
	assert.Equal(t, created, at)
	assert.Equal(t, "a.b", id)
	_, _, err = parseList(k.subject(k.list("ch", created, "a.b")))
	assert.Error(t, err, "a subject is not a key")
	ch, id, err := parseActive(k.active("c.h", "j*"))
	require.NoError(t, err)
	assert.Equal(t, []string{"c.h", "j*"}, []string{ch, id})
}
