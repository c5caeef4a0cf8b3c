package jsjson

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestJSNumberVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	require.GreaterOrEqual(t, len(v.Numbers), 1000, "number vectors")
	for _, n := range v.Numbers {
		f := bitsToFloat(t, n.Bits)
		assert.Equal(t, n.String, string(AppendNumber(nil, f)), "AppendNumber(%v) [bits %s] against JavaScript String()", f, n.Bits)
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
		assert.Equal(t, "x"+tc.want, string(AppendNumber([]byte("x"), tc.f)), "AppendNumber(%v)", tc.f)
	}
}

func TestJSStringVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	for _, s := range v.Strings {
		value, err := hex.DecodeString(s.ValueHex)
		require.NoError(t, err)
		raw := []byte(s.JSON)
		if !assert.NoError(t, CheckText(raw), "CheckText(%s)", s.JSON) {
			continue
		}
		assert.Equal(t, fmt.Sprintf("%x", value), fmt.Sprintf("%x", AppendStringValue(nil, raw[1:len(raw)-1])),
			"AppendStringValue(%s) against JavaScript JSON.parse", s.JSON)
		assert.Equal(t, s.Stringify, string(AppendString(nil, string(value))), "AppendString(%x) against JavaScript JSON.stringify", value)
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
		assert.Equal(t, "x"+tc.want, string(AppendString([]byte("x"), tc.in)), "AppendString(%q)", tc.in)
	}
}

// TestJSStringMatchesEncodingJSON checks AppendString against encoding/json
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
	require.NoError(t, json.Unmarshal(AppendString(nil, s), &back))
	assert.Equal(t, s, back, "AppendString output does not read back as its input")
}

func FuzzJSNumber(f *testing.F) {
	for _, x := range []float64{0, math.Copysign(0, -1), 0.1, 1e21, 1e-7, 123e-20, 5e-324, math.MaxFloat64, 1 << 53, 100, 1e20, math.Inf(1), math.NaN()} {
		f.Add(math.Float64bits(x))
	}
	f.Fuzz(func(t *testing.T, bits uint64) {
		x := math.Float64frombits(bits)
		s := string(AppendNumber(nil, x))
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return
		}
		back, err := strconv.ParseFloat(s, 64)
		require.NoError(t, err, "AppendNumber(%v) = %q", x, s)
		require.Equal(t, x, back, "AppendNumber(%v) = %q reads back", x, s)
		require.True(t, json.Valid([]byte(s)), "AppendNumber(%v) = %q is not a JSON number", x, s)
		// ECMA-262 Number::toString: exponent notation below 1e-6 and from 1e21.
		abs := math.Abs(x)
		require.Equal(t, abs != 0 && (abs < 1e-6 || abs >= 1e21), strings.Contains(s, "e"), "AppendNumber(%v) = %q: wrong notation", x, s)
		// The same significant digits as Go's shortest formatting.
		sig := func(s string) string {
			s, _, _ = strings.Cut(strings.TrimPrefix(s, "-"), "e")
			return strings.TrimRight(strings.TrimLeft(strings.ReplaceAll(s, ".", ""), "0"), "0")
		}
		shortest := strconv.FormatFloat(x, 'e', -1, 64)
		require.Equal(t, sig(shortest), sig(s), "AppendNumber(%v) = %q, digits differ from %s", x, s, shortest)
	})
}

func FuzzJSString(f *testing.F) {
	for _, s := range []string{"", "a\"b\\c", "\x00\x1f\x7f", "\u2028<>&😀", "\xed\xa0\x80", "\xed\xa0\xbd\xed\xb8\x80", "\xff\xe2\x82A", "\xf0\x9f\x98"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendString(nil, s)
		require.True(t, json.Valid(out), "AppendString(%q) = %s is not valid JSON", s, out)
		value := AppendStringValue(nil, out[1:len(out)-1])
		if utf8.ValidString(s) {
			var back string
			require.NoError(t, json.Unmarshal(out, &back), "AppendString(%q) = %s", s, out)
			require.Equal(t, s, back, "AppendString(%q) = %s reads back", s, out)
			require.Equal(t, s, string(value), "AppendStringValue(%s)", out)
		}
		again := AppendString(nil, string(value))
		require.Equal(t, string(out), string(again), "quoting is not stable: %q -> %s -> %q", s, out, value)
	})
}

// TestAppendStringMatchesReference compares AppendString with the old
// one (refAppendQuoted) on every byte and every fragment at every offset of strings of up to
// 19 bytes (so in and around each eight-byte word the new one reads at
// once), and on random strings.
func TestAppendStringMatchesReference(t *testing.T) {
	t.Parallel()
	check := func(s string) {
		t.Helper()
		require.Equal(t, string(refAppendQuoted([]byte("x"), s)), string(AppendString([]byte("x"), s)), "AppendString(%q)", s)
		require.Equal(t, string(refAppendQuoted(nil, []byte(s))), string(AppendStringBytes(nil, []byte(s))), "AppendStringBytes(%q)", s)
	}
	var pieces []string
	for c := range 256 {
		pieces = append(pieces, string([]byte{byte(c)}))
	}
	pieces = append(pieces, stringFragments...)
	for _, p := range pieces {
		for n := range 20 {
			for i := 0; i <= n; i++ {
				check(strings.Repeat("a", i) + p + strings.Repeat("b", n-i))
			}
		}
		check(p + p)
	}
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	for range 20000 {
		check(randomString(rng))
	}
}

// refAppendQuoted is AppendString as it was before it was rewritten for
// speed, kept as the reference TestAppendStringMatchesReference compares it
// with: every string is scanned one byte at a time.
func refAppendQuoted[S ~string | ~[]byte](dst []byte, s S) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"':
				dst = append(dst, '\\', '"')
			case '\\':
				dst = append(dst, '\\', '\\')
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		n, kind := utf8Seq(s, i)
		switch kind {
		case seqValid:
			i += n
			continue
		case seqSurrogate:
			dst = append(dst, s[start:i]...)
			r := surrogateAt(s, i)
			if r < 0xDC00 && i+3 < len(s) {
				if m, k := utf8Seq(s, i+3); m == 3 && k == seqSurrogate {
					if r2 := surrogateAt(s, i+3); r2 >= 0xDC00 {
						dst = utf8.AppendRune(dst, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
						i += 6
						start = i
						continue
					}
				}
			}
			dst = append(dst, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xf], hexDigits[r>>4&0xf], hexDigits[r&0xf])
		default:
			dst = append(dst, s[start:i]...)
			dst = append(dst, "\uFFFD"...)
		}
		i += n
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
