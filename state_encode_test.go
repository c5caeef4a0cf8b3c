package jobkeys

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// The encoder tests compare appendState with the encoder it replaced
// (state_encode_ref_test.go): the output must be the same bytes. (The
// string and time writers are compared with theirs in internal/jsjson.)

// encodeFragments are the pieces stateSource builds strings from besides
// raw bytes: every byte JSON.stringify escapes, the characters it does not
// although other encoders do, WTF-8 lone and paired surrogates, and
// invalid UTF-8 of each kind.
var encodeFragments = []string{
	`"`, `\`, "\x00", "\x01", "\b", "\t", "\n", "\f", "\r", "\x1f", " ", "\x7f", "/", "<>&",
	"é", "\u00a0", "\u2028", "\u2029", "\ufeff", "\uffff", "😀",
	"\xed\xa0\x80", "\xed\xaf\xbf", "\xed\xb0\x80", "\xed\xbf\xbf", // lone surrogates
	"\xed\xa0\xbd\xed\xb8\x80", // a surrogate pair, as WTF-8
	"\xed\xb0\x80\xed\xa0\x80", // a low then a high surrogate: two lone ones
	"\xed\xa0", "\xed", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xf4\x90\x80\x80", "\xf5", "\xc0\xaf",
	"\xe0\x80\x80", "\xf0\x80\x80\x80", "\x80", "\xbf", "\xff", "\xfe",
	"abcdefgh", "0123456789abcdef0123456789abcdef",
}

// stateSource hands out the bytes of data and, once they run out, bytes of
// a generator seeded from data, so that every input describes a whole
// state however short it is.
type stateSource struct {
	data []byte
	rng  *rand.Rand
}

func newStateSource(data []byte) *stateSource {
	h := fnv.New64a()
	_, _ = h.Write(data)
	return &stateSource{data: data, rng: rand.New(rand.NewPCG(h.Sum64(), uint64(len(data))))}
}

func (s *stateSource) byte() byte {
	if len(s.data) == 0 {
		return byte(s.rng.Uint32())
	}
	c := s.data[0]
	s.data = s.data[1:]
	return c
}

func (s *stateSource) uint64() uint64 {
	var b [8]byte
	for i := range b {
		b[i] = s.byte()
	}
	return binary.LittleEndian.Uint64(b[:])
}

// string returns a string of raw bytes and fragments; a third of them are
// empty or plain ASCII, as most real field values are.
func (s *stateSource) string() string {
	switch k := s.byte() % 8; k {
	case 0:
		return ""
	case 1, 2:
		return strings.Repeat("ab-0", int(s.byte()%24))
	}
	var b strings.Builder
	for n := int(s.byte() % 24); n > 0; n-- {
		if c := s.byte(); c < 0xA0 {
			b.WriteByte(s.byte())
		} else {
			b.WriteString(encodeFragments[int(c)%len(encodeFragments)])
		}
	}
	return b.String()
}

// time returns a time across everything appendState may be given: the
// whole range of a Date, the edges of the four-digit years and of
// jsjson.TimeWriter's hand-formatted range, any instant time.Time holds, in any
// zone, with nanoseconds.
func (s *stateSource) time() time.Time {
	ns := int64(s.uint64() % 1e9)
	var t time.Time
	switch s.byte() % 10 {
	case 0, 1:
		ms := int64(s.uint64()%(2*jsjson.MaxTimeMillis+1)) - jsjson.MaxTimeMillis
		t = time.UnixMilli(ms)
	case 2:
		edges := []int64{0, -62167219200, 253402300800, -jsjson.MaxTimeMillis / 1000, jsjson.MaxTimeMillis / 1000, -1 << 44, 1 << 44, 951782400} // ±2^44 s: where jsjson.TimeWriter stops formatting by hand
		t = time.Unix(edges[s.byte()%byte(len(edges))]+int64(int8(s.byte())), ns)
	case 3:
		t = time.Unix(int64(s.uint64()), ns)
	case 4:
		t = time.Unix(int64(s.uint64()%(1<<46))-1<<45, ns)
	case 5:
		t = time.Time{}.Add(time.Duration(s.uint64() % (1 << 40)))
	case 6:
		t = time.Date(int(int32(s.uint64()))%300000, time.Month(s.byte()), int(s.byte()), int(s.byte()), int(s.byte()), int(s.byte()), int(ns), time.UTC)
	default:
		t = time.Date(2026, 11, 30, 10, 0, 2, 0, time.UTC).Add(time.Duration(s.uint64() % (1 << 45)))
	}
	if s.byte()%4 == 0 {
		t = t.In(time.FixedZone("z", int(int32(s.uint64())%(30*3600))))
	}
	return t
}

func (s *stateSource) int() int {
	switch s.byte() % 4 {
	case 0:
		return int(int64(s.uint64()))
	case 1:
		return -int(s.byte())
	}
	return int(s.byte())
}

func (s *stateSource) context() TraceContext {
	if s.byte()%4 == 0 {
		return TraceContext{}
	}
	return TraceContext{RequestID: s.string(), TraceID: s.string(), Traceparent: s.string(), Tracestate: s.string()}
}

// state returns a state with every field drawn from s: none to three
// slots and none to eight queued jobs, or, one time in 32, a thousand.
func (s *stateSource) state() *KeyState {
	st := &KeyState{Version: StateVersion, Service: s.string(), JobType: s.string(), DisplayKey: s.string(),
		KeyHash: s.string(), MaxActive: s.int(), MaxQueuedPerKey: s.int()}
	for n := s.byte() % 4; n > 0; n-- {
		st.Active = append(st.Active, ActiveSlot{JobID: s.string(), SlotToken: s.string(), InstanceID: s.string(),
			StartedAt: s.time(), HeartbeatAt: s.time(), LeaseExpiresAt: s.time(), Tries: s.int(), Context: s.context()})
	}
	queued := int(s.byte() % 32)
	switch {
	case queued == 31:
		queued = 1000
	case queued > 8:
		queued %= 4
	}
	for range queued {
		st.Queued = append(st.Queued, QueuedJob{JobID: s.string(), CreatedAt: s.time(), RequestID: s.string(), Context: s.context()})
	}
	st.StaleTakeoverCount = s.int()
	st.UpdatedAt = s.time()
	return st
}

// requireEncodersAgree checks that appendState writes s as refAppendState
// does, onto an empty and onto a non-empty buffer.
func requireEncodersAgree(t testing.TB, s *KeyState) {
	t.Helper()
	want := refAppendState(nil, s)
	require.Equal(t, string(want), string(appendState(nil, s)), "appendState differs from the old encoder")
	prefix := []byte("prefix")
	require.Equal(t, "prefix"+string(want), string(appendState(prefix, s)), "appendState onto a buffer")
}

// TestEncodeStateMatchesReference compares appendState with the old encoder
// on random states (the seed is printed), the state vectors and the
// benchmark states.
func TestEncodeStateMatchesReference(t *testing.T) {
	t.Parallel()
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	for range 300 {
		var data [8]byte
		binary.LittleEndian.PutUint64(data[:], rng.Uint64())
		requireEncodersAgree(t, newStateSource(data[:]).state())
	}
	for _, name := range stateVectorNames(t) {
		if st, err := ParseState(readStateVector(t, name)); err == nil {
			requireEncodersAgree(t, st)
		}
	}
	for _, n := range benchQueueLengths {
		st, _, _ := benchQueuedState(t, n)
		requireEncodersAgree(t, st)
	}
}

// FuzzEncodeStateDifferential compares appendState with the old encoder
// (state_encode_ref_test.go): whatever ParseState reads from the input is
// written to the same bytes, and so is the state the input describes to
// stateSource (random strings, times, numbers and queue lengths).
//
// Seeds: those of FuzzDecodeStateDifferential (state vectors, the
// FuzzParseState corpus, mutated documents). Run longer with
// go test -run '^$' -fuzz FuzzEncodeStateDifferential -fuzztime 1m .
func FuzzEncodeStateDifferential(f *testing.F) {
	for _, seed := range stateDecodeSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if st, err := ParseState(data); err == nil {
			requireEncodersAgree(t, st)
		}
		requireEncodersAgree(t, newStateSource(data).state())
	})
}

// BenchmarkEncodeStateDistinctTimes measures appendState beside the old
// encoder (refAppendState: each member on its own, each time with a
// TimeWriter of its own) on the states of BenchmarkStateCodec with every
// time on a millisecond of its own, as on a key whose jobs were admitted
// over a while: BenchmarkStateCodec's states have one time throughout,
// which appendState copies after writing it once.
func BenchmarkEncodeStateDistinctTimes(b *testing.B) {
	for _, n := range benchQueueLengths {
		st, _, _ := benchQueuedState(b, n)
		at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
		for i := range st.Queued {
			st.Queued[i].CreatedAt = at.Add(time.Duration(i) * 37 * time.Millisecond)
		}
		st.Active[0].HeartbeatAt = at.Add(time.Hour + time.Millisecond)
		st.Active[0].LeaseExpiresAt = at.Add(2*time.Hour + 2*time.Millisecond)
		st.UpdatedAt = at.Add(time.Hour + 3*time.Millisecond)
		require.Equal(b, string(refAppendState(nil, st)), string(appendState(nil, st)))
		for _, enc := range []struct {
			name   string
			encode func([]byte, *KeyState) []byte
		}{{"old", refAppendState}, {"new", appendState}} {
			b.Run(fmt.Sprintf("%s/queued=%d", enc.name, n), func(b *testing.B) {
				var buf []byte
				b.ReportAllocs()
				for b.Loop() {
					buf = enc.encode(buf[:0], st)
				}
				b.SetBytes(int64(len(buf)))
			})
		}
	}
}
