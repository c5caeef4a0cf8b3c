package jsjson

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanWhole reports whether a Scanner reads text as one value with only
// whitespace after it.
func scanWhole(text []byte) bool {
	var sc Scanner
	sc.Reset(text)
	return sc.I < len(text) && sc.SkipValue(0) && SkipWS(text, sc.I) == len(text)
}

// TestScannerSkipValueAgreesWithCheckText checks that the one-pass Scanner
// accepts exactly the texts CheckText (encoding/json's grammar and the
// depth limit) accepts: the grammar table, nesting at and past MaxDepth,
// and every one-byte change of a document that has each kind of value.
func TestScannerSkipValueAgreesWithCheckText(t *testing.T) {
	t.Parallel()
	check := func(text []byte) {
		t.Helper()
		require.Equal(t, CheckText(text) == nil, scanWhole(text), "CheckText and Scanner disagree on %.60q", text)
	}
	for _, s := range append(append([]string(nil), validTexts...), invalidTexts...) {
		check([]byte(s))
	}
	deep, _ := nested(MaxDepth, "1")
	require.True(t, scanWhole(deep), "nesting of MaxDepth is read")
	tooDeep, _ := nested(MaxDepth+1, "1")
	require.False(t, scanWhole(tooDeep), "nesting past MaxDepth is refused")
	check([]byte(strings.Repeat("[", MaxDepth+1) + strings.Repeat("]", MaxDepth+1)))

	doc := []byte(`{"a":[1,-2.5e3,{"b":"c\u00e9\n"}],"t":true,"f":false,"n":null,"s":"x\"y","":{}}`)
	check(doc)
	changed := 0
	for i := range doc {
		for _, c := range []byte("{}[]\",:\\ 0-+.eE1tfnux\x00\xff") {
			if doc[i] == c {
				continue
			}
			mutated := append([]byte(nil), doc...)
			mutated[i] = c
			check(mutated)
			changed++
		}
		check(append(append([]byte(nil), doc[:i]...), doc[i+1:]...))
	}
	assert.Greater(t, changed, 1000, "mutations checked")
}

// TestScannerObject reads an object's members through Object: names in
// the expected order, out of it, escaped, duplicated and unknown, with
// their values read by ScanString, Number and SkipValue.
func TestScannerObject(t *testing.T) {
	t.Parallel()
	names := MemberNames("id", "n", "tags")
	text := []byte(` { "id" : "a" , "n":1.5, "x":{"y":[1,2]}, "\u0074ags":[],"n":-7,"ID":"no","id":"b\u00e9"} `)
	var sc Scanner
	sc.Reset(text)
	var seen []int
	var ids []string
	var ns []float64
	ok := sc.Object(names, func(k int) bool {
		seen = append(seen, k)
		switch k {
		case 0:
			start, end, plain, ok := sc.ScanString()
			if ok {
				v := sc.Text[start:end]
				if !plain {
					v = AppendStringValue(nil, v)
				}
				ids = append(ids, string(v))
			}
			return ok
		case 1:
			f, ok := sc.Number()
			ns = append(ns, f)
			return ok
		}
		return sc.SkipValue(1)
	})
	require.True(t, ok, "Object at byte %d", sc.I)
	assert.Equal(t, len(text)-1, sc.I, "Object stops after the closing brace")
	assert.Equal(t, []int{0, 1, -1, 2, 1, -1, 0}, seen, "member indices, -1 for names not asked for (names match exactly)")
	assert.Equal(t, []string{"a", "bé"}, ids)
	assert.Equal(t, []float64{1.5, -7}, ns)

	for _, bad := range []string{`{"id":"a",}`, `{"id" "a"}`, `{"id":"a"`, `{"id":"a"]`, `{id:"a"}`} {
		sc.Reset([]byte(bad))
		assert.False(t, sc.Object(names, func(k int) bool {
			_, _, _, ok := sc.ScanString()
			return ok
		}), "Object(%s)", bad)
	}
}

// TestScannerNumber reads numbers as JSON.parse does: exact integers on
// the fast path, the nearest double otherwise, and ±Infinity past the
// doubles.
func TestScannerNumber(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		text string
		want float64
	}{
		{"0", 0}, {"-0", 0}, {"123456789012345", 123456789012345}, {"-42", -42},
		{"9007199254740993", 9007199254740992}, {"0.1", 0.1}, {"1e21", 1e21}, {"-1.5E-3", -1.5e-3},
	} {
		var sc Scanner
		sc.Reset([]byte(tc.text))
		f, ok := sc.Number()
		require.True(t, ok, "Number(%s)", tc.text)
		assert.Equal(t, tc.want, f, "Number(%s)", tc.text)
		assert.Equal(t, len(tc.text), sc.I, "Number(%s) stops at the end", tc.text)
	}
	var sc Scanner
	sc.Reset([]byte("-1e400"))
	f, ok := sc.Number()
	require.True(t, ok)
	assert.True(t, f < 0 && f*2 == f, "-1e400 reads as -Infinity, got %v", f)
	for _, bad := range []string{"-", "01x", "1.", "1e", ".5", "+1"} {
		sc.Reset([]byte(bad))
		if f, ok := sc.Number(); ok {
			assert.NotEqual(t, len(bad), sc.I, "Number(%s) read all of it as %v", bad, f)
		}
	}
}
