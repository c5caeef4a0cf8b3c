package jobs_test

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/jobs"
)

const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// idMillis decodes the 48-bit millisecond prefix of an id of NewID.
func idMillis(t *testing.T, id string) int64 {
	t.Helper()
	var ms int64
	for _, c := range id[:10] {
		i := strings.IndexRune(crockford, c)
		require.GreaterOrEqualf(t, i, 0, "id %q has %q outside Crockford base 32", id, c)
		ms = ms<<5 | int64(i)
	}
	return ms
}

// TestNewIDOrderedAndUnique: ids of one process sort as strings in the
// order they were made, carry the time they were made, and never repeat,
// also when made from many goroutines in the same millisecond.
func TestNewIDOrderedAndUnique(t *testing.T) {
	t.Parallel()
	before := time.Now().UnixMilli()
	seq := make([]string, 5000)
	for i := range seq {
		seq[i] = jobs.NewID()
	}
	after := time.Now().UnixMilli()
	for i, id := range seq {
		require.Len(t, id, jobs.IDLength)
		for _, c := range id {
			require.Truef(t, strings.ContainsRune(crockford, c), "id %q has %q outside Crockford base 32", id, c)
		}
		ms := idMillis(t, id)
		require.Truef(t, ms >= before && ms <= after, "id %q carries %d ms, outside the %d..%d it was made in", id, ms, before, after)
		if i > 0 {
			require.Lessf(t, seq[i-1], id, "id %d is not after id %d", i, i-1)
		}
	}

	const workers, each = 8, 2000
	all := make([][]string, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				all[w] = append(all[w], jobs.NewID())
			}
		})
	}
	wg.Wait()
	seen := make(map[string]bool, workers*each+len(seq))
	for _, id := range slices.Concat(append(all, seq)...) {
		require.Falsef(t, seen[id], "id %q made twice", id)
		seen[id] = true
	}
	for w := range workers {
		assert.Truef(t, slices.IsSorted(all[w]), "the ids of goroutine %d are not in the order it made them", w)
	}
}

// TestFingerprint: one fingerprint per type, version and input, whatever
// the JSON's spacing; null is no input.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	base := jobs.Fingerprint("render", 1, json.RawMessage(`{"doc":"a","n":[1,2]}`))
	assert.True(t, strings.HasPrefix(base, "sha256:"), base)
	assert.Len(t, base, len("sha256:")+64)
	assert.Equal(t, base, jobs.Fingerprint("render", 1, json.RawMessage(" {\"doc\" : \"a\",\n \"n\": [1, 2]} ")), "spacing")
	assert.NotEqual(t, base, jobs.Fingerprint("render", 2, json.RawMessage(`{"doc":"a","n":[1,2]}`)), "version")
	assert.NotEqual(t, base, jobs.Fingerprint("print", 1, json.RawMessage(`{"doc":"a","n":[1,2]}`)), "type")
	assert.NotEqual(t, base, jobs.Fingerprint("render", 1, json.RawMessage(`{"doc":"b","n":[1,2]}`)), "input")
	assert.Equal(t, jobs.Fingerprint("render", 1, nil), jobs.Fingerprint("render", 1, json.RawMessage(" null ")), "null is no input")
	// The type is delimited: a type cannot borrow the version's digits.
	assert.NotEqual(t, jobs.Fingerprint("a1", 1, nil), jobs.Fingerprint("a", 11, nil))
}
