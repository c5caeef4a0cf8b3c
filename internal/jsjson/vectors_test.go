package jsjson

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The vectors real JavaScript wrote, kept in the module's testdata (the
// key derivation's tests read the same files).
var (
	keyhashExtra = filepath.Join("..", "..", "testdata", "keyhash_extra.json")
	dateVectors  = filepath.Join("..", "..", "testdata", "dateparse", "vectors.json")
)

// jsVectors is the part of testdata/keyhash_extra.json, written by real
// JavaScript with internal/jsvectors/gen.mjs, that this package's tests
// read: numbers as String() prints them, number literals as JSON.parse
// reads them, and strings both ways.
type jsVectors struct {
	Numbers []struct {
		Bits   string `json:"bits"`
		String string `json:"string"`
	} `json:"numbers"`
	NumberTexts []struct {
		Text   string `json:"text"`
		Bits   string `json:"bits"`
		String string `json:"string"`
	} `json:"numberTexts"`
	Strings []struct {
		JSON      string `json:"json"`
		ValueHex  string `json:"valueHex"`
		Stringify string `json:"stringify"`
	} `json:"strings"`
}

var (
	jsVectorsOnce sync.Once
	jsVectorsData jsVectors
	jsVectorsErr  error
)

// loadJSVectors reads testdata/keyhash_extra.json once per test binary.
func loadJSVectors(t testing.TB) *jsVectors {
	t.Helper()
	jsVectorsOnce.Do(func() {
		var b []byte
		if b, jsVectorsErr = os.ReadFile(keyhashExtra); jsVectorsErr == nil {
			jsVectorsErr = json.Unmarshal(b, &jsVectorsData)
		}
	})
	require.NoError(t, jsVectorsErr, "reading JavaScript vectors (regenerate with node internal/jsvectors/gen.mjs > testdata/keyhash_extra.json)")
	return &jsVectorsData
}

func bitsToFloat(t testing.TB, bits string) float64 {
	t.Helper()
	u, err := strconv.ParseUint(bits, 16, 64)
	require.NoError(t, err, "bad bits %q", bits)
	return math.Float64frombits(u)
}

// toISOStringVector is a time in Unix milliseconds and what toISOString
// writes for it, from testdata/dateparse/vectors.json (written by real
// JavaScript with testdata/dateparse/gen.mjs).
type toISOStringVector struct {
	MS  int64  `json:"ms"`
	ISO string `json:"iso"`
}

func loadToISOStringVectors(t testing.TB) []toISOStringVector {
	t.Helper()
	b, err := os.ReadFile(dateVectors)
	require.NoError(t, err, "regenerate with node testdata/dateparse/gen.mjs > testdata/dateparse/vectors.json")
	var v struct {
		ToISOString []toISOStringVector `json:"toISOString"`
	}
	require.NoError(t, json.Unmarshal(b, &v))
	require.NotEmpty(t, v.ToISOString)
	return v.ToISOString
}

// nested returns {"a":{"a":...{"a":leaf}...}}, depth objects deep, and the
// pointer /a/a/.../a that reaches leaf.
func nested(depth int, leaf string) ([]byte, string) {
	return []byte(strings.Repeat(`{"a":`, depth) + leaf + strings.Repeat("}", depth)),
		strings.Repeat("/a", depth)
}

// stringFragments are the pieces randomString builds strings from besides
// raw bytes: every byte JSON.stringify escapes, the characters it does not
// although other encoders do, WTF-8 lone and paired surrogates, and
// invalid UTF-8 of each kind.
var stringFragments = []string{
	`"`, `\`, "\x00", "\x01", "\b", "\t", "\n", "\f", "\r", "\x1f", " ", "\x7f", "/", "<>&",
	"é", "\u00a0", "\u2028", "\u2029", "\ufeff", "\uffff", "😀",
	"\xed\xa0\x80", "\xed\xaf\xbf", "\xed\xb0\x80", "\xed\xbf\xbf", // lone surrogates
	"\xed\xa0\xbd\xed\xb8\x80", // a surrogate pair, as WTF-8
	"\xed\xb0\x80\xed\xa0\x80", // a low then a high surrogate: two lone ones
	"\xed\xa0", "\xed", "\xc3", "\xe2\x82", "\xf0\x9f\x98", "\xf4\x90\x80\x80", "\xf5", "\xc0\xaf",
	"\xe0\x80\x80", "\xf0\x80\x80\x80", "\x80", "\xbf", "\xff", "\xfe",
	"abcdefgh", "0123456789abcdef0123456789abcdef",
}

// randomString returns up to 40 pieces, each a fragment, a random byte or
// a run of plain ASCII.
func randomString(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(41) {
		switch rng.IntN(3) {
		case 0:
			b.WriteString(stringFragments[rng.IntN(len(stringFragments))])
		case 1:
			b.WriteByte(byte(rng.IntN(256)))
		default:
			b.WriteString(strings.Repeat("x", rng.IntN(20)))
		}
	}
	return b.String()
}

// randomTime returns a time across everything a TimeWriter may be given:
// the whole range of a Date, the edges of the four-digit years and of the
// hand-formatted range, any instant time.Time holds, in any zone, with
// nanoseconds.
func randomTime(rng *rand.Rand) time.Time {
	ns := rng.Int64N(1e9)
	var t time.Time
	switch rng.IntN(6) {
	case 0, 1:
		t = time.UnixMilli(rng.Int64N(2*MaxTimeMillis+1) - MaxTimeMillis)
	case 2:
		edges := []int64{0, -62167219200, 253402300800, -MaxTimeMillis / 1000, MaxTimeMillis / 1000, -fastTimeSeconds, fastTimeSeconds, 951782400}
		t = time.Unix(edges[rng.IntN(len(edges))]+rng.Int64N(256)-128, ns)
	case 3:
		t = time.Unix(int64(rng.Uint64()), ns)
	case 4:
		t = time.Unix(rng.Int64N(1<<46)-1<<45, ns)
	default:
		t = time.Date(2026, 11, 30, 10, 0, 2, 0, time.UTC).Add(time.Duration(rng.Int64N(1 << 45)))
	}
	if rng.IntN(4) == 0 {
		t = t.In(time.FixedZone("z", rng.IntN(60*3600)-30*3600))
	}
	return t
}
