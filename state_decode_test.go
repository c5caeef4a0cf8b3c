package jobkeys

import (
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The single-pass decoder reads every document as the decoder it replaced
// does (refDecodeState): the seeds of FuzzDecodeStateDifferential, every
// one-byte change, deletion and truncation of a vector with an unknown
// member, and random splices of vectors.
func TestDecodeStateMatchesReference(t *testing.T) {
	t.Parallel()
	for _, seed := range stateDecodeSeeds(t) {
		requireDecodersAgree(t, seed)
	}
	doc := withMember(t, "queued[0].context", `"x":[{"y":"\u00e9"}]`, true)
	for i := range doc {
		for _, c := range []byte("\"\\{}[],:01e.+-tnu \x80\xff\x00") {
			requireDecodersAgree(t, slices.Concat(doc[:i], []byte{c}, doc[i+1:]))
			requireDecodersAgree(t, slices.Concat(doc[:i], []byte{c}, doc[i:]))
		}
		requireDecodersAgree(t, slices.Concat(doc[:i], doc[i+1:]))
		requireDecodersAgree(t, doc[:i])
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("splice seed %d", seed)
	rng := mrand.New(mrand.NewPCG(seed, 1))
	docs := [][]byte{doc, benchStateBytes(t, 2), readStateVector(t, "rust-style-no-slot-context.json")}
	for range 2000 {
		a, b := docs[rng.IntN(len(docs))], docs[rng.IntN(len(docs))]
		i, j := rng.IntN(len(a)+1), rng.IntN(len(b)+1)
		requireDecodersAgree(t, slices.Concat(a[:i], b[j:]))
	}
}

// Large states, and strings with escapes and non-ASCII bytes in every
// member, read as the old decoder reads them; the strings of a state share
// one allocation yet hold what they held.
func TestDecodeStateLargeAndEscaped(t *testing.T) {
	t.Parallel()
	for _, n := range []int{0, 1, 17, 300} {
		requireDecodersAgree(t, benchStateBytes(t, n))
	}
	esc := func(s string) string { return `"\u0041` + s + `\ud83d\ude00é\t\ud800"` }
	slot := `{"jobId":` + esc("j") + `,"slotToken":` + esc("t") + `,"instanceId":` + esc("w") +
		`,"startedAt":"2026-11-30T10:00:02.000Z","heartbeatAt":"2026-11-30T10:00:02.000Z",` +
		`"leaseExpiresAt":"2026-11-30T10:02:02.000Z","tries":1,"context":{"requestId":` + esc("r") +
		`,"traceId":` + esc("x") + `,"traceparent":"00-` + esc("x")[1:] + `,"tracestate":` + esc("s") + `}}`
	entry := `{"jobId":` + esc("q") + `,"createdAt":"2026-11-30T10:00:01.000Z","requestId":` + esc("r") +
		`,"context":{"requestId":` + esc("r") + `,"traceId":"x","traceparent":"00-x-y-01"}}`
	doc := `{"version":1,"service":` + esc("s") + `,"jobType":` + esc("j") + `,"key":` + esc("k") +
		`,"keyHash":` + esc("h") + `,"maxActive":2,"active":[` + slot + `],"queued":[` + entry + `,` + entry +
		`],"staleTakeoverCount":0,"updatedAt":"2026-11-30T10:00:02.000Z"}`
	requireDecodersAgree(t, []byte(doc))
	s, err := decodeState([]byte(doc))
	require.NoError(t, err)
	assert.Equal(t, "Ar\U0001F600é\t\xed\xa0\x80", s.Queued[1].Context.RequestID)
	assert.Equal(t, s.Queued[1].RequestID, s.Queued[1].Context.RequestID)
	assert.Equal(t, "x", s.Queued[0].Context.TraceID)
	// A later decode, with the decoder's buffers reused, leaves the first
	// state's strings as they were.
	other := strings.ReplaceAll(doc, "\\u0041", "\\u0042")
	s2, err := decodeState([]byte(other))
	require.NoError(t, err)
	assert.Equal(t, "Bs\U0001F600é\t\xed\xa0\x80", s2.Service)
	assert.Equal(t, "As\U0001F600é\t\xed\xa0\x80", s.Service, "the first state's strings changed")
}

// decodeState allocates the state, its two slices and one block for its
// strings, however many jobs it holds.
func TestDecodeStateAllocations(t *testing.T) {
	if raceEnabled() {
		// The race detector makes sync.Pool drop items at random.
		t.Skip("allocations are not representative under -race")
	}
	for _, n := range []int{0, 100} {
		data := benchStateBytes(t, n)
		allocs := testing.AllocsPerRun(50, func() {
			_, err := decodeState(data)
			require.NoError(t, err)
		})
		assert.LessOrEqual(t, allocs, 4.0, "allocations decoding a state with %d queued jobs", n)
	}
}

// Every byte that ends or escapes a string, or is not ASCII, is found at
// every place of the eight-byte words scanString reads strings in, and the
// bytes beside those are read as plain.
func TestDecodeStateStringBytesAtEveryOffset(t *testing.T) {
	t.Parallel()
	for n := range 20 {
		for at := range n {
			for _, c := range []byte{0x00, 0x1f, 0x20, 0x21, '"', 0x23, '\\', 0x5b, 0x5d, 0x7f, 0x80, 0xc3, 0xff} {
				key := []byte(strings.Repeat("k", n))
				key[at] = c
				doc := withMember(t, "", `"key":"`+string(key)+`"`, true)
				requireDecodersAgree(t, doc)
				if c == '\\' && at+1 < n { // an escape
					key[at+1] = 'n'
					requireDecodersAgree(t, withMember(t, "", `"key":"`+string(key)+`"`, true))
				}
			}
		}
	}
}
