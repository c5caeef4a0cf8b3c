package jsjson

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// validTexts and invalidTexts are JSON texts JSON.parse reads and refuses.
var validTexts = []string{
	`0`, `-0`, `1.5e-3`, `1E+2`, `true`, `false`, `null`, `""`, `"\u00e9\ud800\/"`,
	` {} `, `[]`, `[[]]`, `{"a":[1,{"b":null}],"c":"d"}`, "\t\r\n [ 1 , 2 ] \t\r\n",
	"\"\xff\xfe\"", // invalid UTF-8 inside a string reads as U+FFFD
}
var invalidTexts = []string{
	``, ` `, `{`, `[`, `]`, `{]`, `[}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,]`, `{,}`,
	`01`, `-`, `-a`, `1.`, `.1`, `1e`, `1e+`, `+1`, `0x1`, `NaN`, `Infinity`, `tru`, `nul`, `falsey`,
	`"abc`, `"\x"`, `"\u12"`, `"\u12x4"`, "\"\t\"", "\"\x00\"", `{'a':1}`, `{a:1}`, `[1 2]`,
	`1 2`, `{} {}`, "\xef\xbb\xbf{}", "\xff", "[\xff]", "\u00a0{}", "\f{}", "{}\x00",
	strings.Repeat("[", 1000),
}

func TestCheckJSONText(t *testing.T) {
	t.Parallel()
	for _, s := range validTexts {
		assert.NoError(t, CheckText([]byte(s)), "CheckText(%.40q)", s)
	}
	for _, s := range invalidTexts {
		assert.Error(t, CheckText([]byte(s)), "CheckText(%.40q)", s)
	}
	err := CheckText([]byte(`{"a":1,}`))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "at byte 7", "the error says where")

	// Nesting: up to MaxDepth is fine (and resolves), one more is an
	// error that says the limit, however the text goes on.
	deep, pointer := nested(MaxDepth, "1")
	require.NoError(t, CheckText(deep))
	pos, ok := Resolve(deep, pointer)
	require.True(t, ok)
	assert.Equal(t, byte('1'), deep[pos])
	for _, text := range []string{
		string(deep[:MaxDepth*5]) + `{"a":1}` + string(deep[MaxDepth*5:]),
		strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1),
		strings.Repeat(`[{"a":`, 500000) + "1" + strings.Repeat("}]", 500000),
		strings.Repeat("[", 3*MaxDepth),
	} {
		err := CheckText([]byte(text))
		require.ErrorIs(t, err, ErrTooDeep, "%.20s... (%d bytes)", text, len(text))
		assert.Contains(t, err.Error(), fmt.Sprint(MaxDepth))
	}
	// Brackets inside strings do not count.
	inString := `["` + strings.Repeat("[{", 3*MaxDepth) + `"]`
	assert.NoError(t, CheckText([]byte(inString)))
}

// TestJSONNumberTextVectors checks that number literals read as the doubles
// JSON.parse reads them as, and print as String() prints them.
func TestJSONNumberTextVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	for _, n := range v.NumberTexts {
		text := []byte(n.Text)
		if !assert.NoError(t, CheckText(text), "CheckText(%.40s)", n.Text) {
			continue
		}
		f, _ := strconv.ParseFloat(string(text[:ValueEnd(text, 0)]), 64)
		want := bitsToFloat(t, n.Bits)
		assert.Equal(t, math.Float64bits(want), math.Float64bits(f), "%.40s reads as %v, JSON.parse reads %v", n.Text, f, want)
		assert.Equal(t, n.String, string(AppendNumber(nil, f)), "%.40s prints as JavaScript prints it", n.Text)
	}
}

func TestJSONStringDecoding(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ raw, want string }{
		{`plain`, "plain"},
		{`\"\\\/\b\f\n\r\t`, "\"\\/\b\f\n\r\t"},
		{`\u0041\u00e9\u00E9\u20ac`, "Aéé€"},
		{`\ud83d\ude00`, "😀"},
		{`\uD83D\uDE00`, "😀"},
		{`\ud800`, "\xed\xa0\x80"},
		{`\udc00\ud800`, "\xed\xb0\x80\xed\xa0\x80"},
		{`\ud83d\ud83d\ude00`, "\xed\xa0\xbd😀"},
		{`\ud83dx`, "\xed\xa0\xbdx"},
		{`\ud83d\n`, "\xed\xa0\xbd\n"},
		{`\ud83d\\ude00`, "\xed\xa0\xbd\\ude00"},
		{"\xed\xa0\x80", "\uFFFD\uFFFD\uFFFD"},
		{"\xe2\x82A", "\uFFFDA"},
		{"\xf0\x9f\x98", "\uFFFD"},
		{"a\xffb\xc3\xa9", "a\uFFFDbé"},
	} {
		assert.Equal(t, "x"+tc.want, string(AppendStringValue([]byte("x"), []byte(tc.raw))), "AppendStringValue(%q)", tc.raw)
	}
}
