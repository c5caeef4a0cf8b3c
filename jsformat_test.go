package jobkeys

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// jsVectors is testdata/keyhash_extra.json, written by real JavaScript with
// internal/jsvectors/gen.mjs.
type jsVectors struct {
	Cases   []keyVector `json:"cases"`
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
		if b, jsVectorsErr = os.ReadFile("testdata/keyhash_extra.json"); jsVectorsErr == nil {
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

func TestJSNumberVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	require.GreaterOrEqual(t, len(v.Numbers), 1000, "number vectors")
	for _, n := range v.Numbers {
		f := bitsToFloat(t, n.Bits)
		assert.Equal(t, n.String, string(appendJSNumber(nil, f)), "appendJSNumber(%v) [bits %s] against JavaScript String()", f, n.Bits)
	}
}

func TestJSNumberCases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		f    float64
		want string
	}{
		{0, "0"},
		{math.Copysign(0, -1), "0"},
		{0.1, "0.1"},
		{100, "100"},
		{1e20, "100000000000000000000"},
		{1e21, "1e+21"},
		{1e-7, "1e-7"},
		{1.5e-7, "1.5e-7"},
		{1e-6, "0.000001"},
		{123e-20, "1.23e-18"},
		{1.2345e25, "1.2345e+25"},
		{5e-324, "5e-324"},
		{math.MaxFloat64, "1.7976931348623157e+308"},
		{1 << 53, "9007199254740992"},
		{12345678901234567890, "12345678901234567000"},
		{-2.5, "-2.5"},
		{math.Inf(1), "Infinity"},
		{math.Inf(-1), "-Infinity"},
		{math.NaN(), "NaN"},
	} {
		assert.Equal(t, "x"+tc.want, string(appendJSNumber([]byte("x"), tc.f)), "appendJSNumber(%v)", tc.f)
	}
}

func TestJSStringVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	for _, s := range v.Strings {
		value, err := hex.DecodeString(s.ValueHex)
		require.NoError(t, err)
		raw := []byte(s.JSON)
		if !assert.NoError(t, checkJSONText(raw), "checkJSONText(%s)", s.JSON) {
			continue
		}
		assert.Equal(t, fmt.Sprintf("%x", value), fmt.Sprintf("%x", appendStringValue(nil, raw[1:len(raw)-1])),
			"appendStringValue(%s) against JavaScript JSON.parse", s.JSON)
		assert.Equal(t, s.Stringify, string(appendJSString(nil, string(value))), "appendJSString(%x) against JavaScript JSON.stringify", value)
	}
}

func TestJSStringCases(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"", `""`},
		{"plain", `"plain"`},
		{"a\"b\\c/d", `"a\"b\\c/d"`},
		{"\b\f\n\r\t\x00\x1f", `"\b\f\n\r\t\u0000\u001f"`},
		{"\x7f<>&\u2028\u2029é😀", "\"\x7f<>&\u2028\u2029é😀\""},
		// WTF-8 lone surrogates are escaped; a WTF-8 pair is one character.
		{"\xed\xa0\x80", `"\ud800"`},
		{"a\xed\xbf\xbfb", `"a\udfffb"`},
		{"\xed\xa0\xbd\xed\xb8\x80", `"😀"`},
		{"\xed\xb8\x80\xed\xa0\xbd", `"\ude00\ud83d"`},
		{"\xed\xa0\xbd\xed\xa0\xbd\xed\xb8\x80", `"\ud83d😀"`},
		// Other invalid UTF-8: one U+FFFD per maximal invalid subsequence.
		{"\xff", "\"\uFFFD\""},
		{"\xe2\x82A", "\"\uFFFDA\""},
		{"\xf0\x9f\x98", "\"\uFFFD\""},
		{"\xc0\x80", "\"\uFFFD\uFFFD\""},
		{"\xed\xa0", "\"\uFFFD\uFFFD\""},
	} {
		assert.Equal(t, "x"+tc.want, string(appendJSString([]byte("x"), tc.in)), "appendJSString(%q)", tc.in)
	}
}

// TestJSStringMatchesEncodingJSON checks appendJSString against encoding/json
// on valid UTF-8: both must read back as the same string.
func TestJSStringMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	var all []rune
	for r := rune(0); r < 0x3000; r++ {
		all = append(all, r)
	}
	all = append(all, 0xfeff, 0xfffd, 0xffff, 0x10000, 0x1f600, 0x10ffff)
	s := string(all)
	require.True(t, utf8.ValidString(s), "test string is not valid UTF-8")
	var back string
	require.NoError(t, json.Unmarshal(appendJSString(nil, s), &back))
	assert.Equal(t, s, back, "appendJSString output does not read back as its input")
}
