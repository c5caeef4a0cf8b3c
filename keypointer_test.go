package jobkeys

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

func TestCheckPointer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"/", []string{""}},
		{"//", []string{"", ""}},
		{"/a", []string{"a"}},
		{"/a/", []string{"a", ""}},
		{"/a/b/0", []string{"a", "b", "0"}},
		{"/a~1b", []string{"a/b"}},
		{"/m~0n", []string{"m~n"}},
		{"/~01", []string{"~1"}}, // not "/": "~1" is decoded first, then "~0"
		{"/~10", []string{"/0"}},
		{"/~0~1~1~0", []string{"~//~"}},
		{"/café/日本/😀", []string{"café", "日本", "😀"}},
		{"/ /\t", []string{" ", "\t"}},
	} {
		got, err := parsePointer(tc.in)
		require.NoError(t, err, "parsePointer(%q)", tc.in)
		assert.Equal(t, tc.want, got, "parsePointer(%q)", tc.in)
		assert.NoError(t, checkPointer(tc.in), "checkPointer(%q)", tc.in)
	}
	for _, in := range []string{"", "a", "a/b", "~0", "/~", "/a~", "/~2", "/a~b", "/~~0", "/ok/~x"} {
		err := checkPointer(in)
		require.ErrorIs(t, err, ErrInvalidPolicy, "checkPointer(%q)", in)
		assert.Contains(t, err.Error(), strconv.Quote(in), "the error names the pointer")
		_, err = parsePointer(in)
		assert.ErrorIs(t, err, ErrInvalidPolicy, "parsePointer(%q)", in)
	}
}

func TestResolveText(t *testing.T) {
	t.Parallel()
	const text = `{"":{"":"deep"},"a":[10,"x",[true],{"k":null}],"a/b":{"m~n":"v"},"0":"zero","s":"str","n":1.5}`
	for _, tc := range []struct {
		pointer string
		want    string // the value's JSON text; "" where nothing resolves
	}{
		{"/", `{"":"deep"}`},
		{"//", `"deep"`},
		{"/a/0", `10`},
		{"/a/1", `"x"`},
		{"/a/2/0", `true`},
		{"/a/3/k", `null`}, // null resolves: it is a value, just not a key segment
		{"/a/4", ""},
		{"/a/01", ""},
		{"/a/-", ""},
		{"/a/-0", ""},
		{"/a/+1", ""},
		{"/a/1e0", ""},
		{"/a/ 1", ""},
		{"/a/99999999999999999999999", ""},
		{"/a/length", ""},
		{"/a/", ""},
		{"/a~1b/m~0n", `"v"`},
		{"/0", `"zero"`},
		{"/s/0", ""},
		{"/s/length", ""},
		{"/n/x", ""},
		{"/a/3/k/x", ""},
		{"/constructor", ""},
		{"/__proto__", ""},
	} {
		pos, ok := jsjson.Resolve([]byte(text), tc.pointer)
		if tc.want == "" {
			assert.False(t, ok, "jsjson.Resolve(%q) resolved", tc.pointer)
		} else if assert.True(t, ok, "jsjson.Resolve(%q)", tc.pointer) {
			assert.Equal(t, tc.want, text[pos:jsjson.ValueEnd([]byte(text), pos)], "jsjson.Resolve(%q)", tc.pointer)
		}
		checkResolveTextAgrees(t, []byte(text), tc.pointer)
	}
	// The last of duplicate members counts, also when it does not resolve
	// further and an earlier one would.
	for _, tc := range []struct{ text, pointer, want string }{
		{`{"a":1,"a":2}`, "/a", "2"},
		{`{"a":{"b":1},"a":{"c":2}}`, "/a/b", ""},
		{`{"a":{"b":1},"a":{"b":3}}`, "/a/b", "3"},
		{`{"a":{"b":1},"a":"x"}`, "/a/b", ""},
		{`[{"a":[0,{"b":1}]},{"a":9}]`, "/0/a/1/b", "1"},
		{`{"a":[1],"b":2,"a":[3]}`, "/a/0", "3"},
		{`{"caf\u00e9":1,"café":2}`, "/café", "2"},
		{`{"\u0061":1}`, "/a", "1"},
	} {
		pos, ok := jsjson.Resolve([]byte(tc.text), tc.pointer)
		if tc.want == "" {
			assert.False(t, ok, "jsjson.Resolve(%s, %q)", tc.text, tc.pointer)
			continue
		}
		if assert.True(t, ok, "jsjson.Resolve(%s, %q)", tc.text, tc.pointer) {
			assert.Equal(t, tc.want, tc.text[pos:jsjson.ValueEnd([]byte(tc.text), pos)], "jsjson.Resolve(%s, %q)", tc.text, tc.pointer)
		}
	}
}

// checkResolveTextAgrees checks that jsjson.Resolve finds in text what
// resolvePointer finds in text decoded by encoding/json. text must be valid
// UTF-8 without surrogate escapes, where the two decoders agree.
func checkResolveTextAgrees(t testing.TB, text []byte, pointer string) {
	t.Helper()
	tokens, err := parsePointer(pointer)
	require.NoError(t, err, "parsePointer(%q)", pointer)
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var doc any
	require.NoError(t, dec.Decode(&doc), "decoding %q", text)
	want, wantOK := resolvePointer(doc, tokens)
	pos, ok := jsjson.Resolve(text, pointer)
	require.Equal(t, wantOK, ok, "jsjson.Resolve(%q, %q) found %v, resolvePointer found %v", text, pointer, ok, wantOK)
	if !ok {
		return
	}
	raw := text[pos:jsjson.ValueEnd(text, pos)]
	var got any
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	require.NoError(t, dec.Decode(&got), "jsjson.Resolve(%q, %q) stopped at %q", text, pointer, raw)
	require.Equal(t, want, got, "jsjson.Resolve(%q, %q) = %q", text, pointer, raw)
	if s, isString := want.(string); isString {
		require.Equal(t, s, string(jsjson.AppendStringValue(nil, raw[1:len(raw)-1])), "jsjson.AppendStringValue(%s)", raw)
	}
}

// TestResolveTextJSVectors resolves every pointer of the JavaScript vectors
// both ways wherever encoding/json decodes as JavaScript does.
func TestResolveTextJSVectors(t *testing.T) {
	t.Parallel()
	ran := 0
	for _, c := range loadJSVectors(t).Cases {
		p := c.payloadBytes(t)
		if !utf8.Valid(p) || surrogateEscape.Match(p) || !json.Valid(p) {
			continue
		}
		for _, seg := range c.Template {
			if strings.HasPrefix(seg, "/") && checkPointer(seg) == nil {
				checkResolveTextAgrees(t, p, seg)
				ran++
			}
		}
	}
	assert.GreaterOrEqual(t, ran, 500, "pointers checked")
}

// nested returns {"a":{"a":...{"a":leaf}...}}, depth objects deep, and the
// pointer /a/a/.../a that reaches leaf.
func nested(depth int, leaf string) ([]byte, string) {
	return []byte(strings.Repeat(`{"a":`, depth) + leaf + strings.Repeat("}", depth)),
		strings.Repeat("/a", depth)
}

// TestResolveTextLinear is the regression test for pointer resolution that
// took the document's depth times its size (30,000 levels took 7 s): each
// level read the whole value of the member it matched to its end, to look
// for a later duplicate, and then the next level read it again. Resolving a
// pointer must cost the document's size, so four times the depth may cost
// about four times as much, never sixteen.
//
// It compares the fastest of several runs at two sizes, so a loaded
// machine slows both sides alike; the bound (8x for 4x the size) is halfway,
// on a log scale, between linear and quadratic.
func TestResolveTextLinear(t *testing.T) {
	// perOp is the fastest time of one resolution depth levels deep, over
	// 15 rounds of reps resolutions each.
	perOp := func(depth, reps int) float64 {
		text, pointer := nested(depth, `"leaf"`)
		require.NoError(t, jsjson.CheckText(text))
		best := time.Duration(math.MaxInt64)
		for range 15 {
			start := time.Now()
			for range reps {
				pos, ok := jsjson.Resolve(text, pointer)
				require.True(t, ok)
				require.Equal(t, byte('"'), text[pos])
			}
			best = min(best, time.Since(start))
		}
		return float64(best) / float64(reps)
	}
	// 16 times the depth costs about 16 times as much when resolution is
	// linear and about 256 times when it is quadratic; 64 sits far from
	// both, so a loaded machine does not tip the verdict either way.
	small, large := MaxPayloadDepth/16, MaxPayloadDepth
	var ratio float64
	for range 3 { // a retry for a pause that hit only the large side
		ratio = perOp(large, 4) / max(perOp(small, 64), 1)
		if ratio < 64 {
			return
		}
	}
	require.Failf(t, "not linear in the size", "resolving a pointer %d levels deep costs %.1fx what %d levels cost", large, ratio, small)
}

// parsePointer splits an RFC 6901 JSON pointer into its reference tokens, as
// an independent reading of the pointer for tests: the pointer must start
// with "/"; in each token "~1" stands for "/" and "~0" for "~". A "~"
// followed by anything else is an error wrapping [ErrInvalidPolicy] that
// names the pointer.
func parsePointer(pointer string) ([]string, error) {
	if pointer == "" || pointer[0] != '/' {
		return nil, fmt.Errorf("%w: key pointer %q does not start with \"/\"", ErrInvalidPolicy, pointer)
	}
	tokens := strings.Split(pointer[1:], "/")
	for i, tok := range tokens {
		var b strings.Builder
		for j := 0; j < len(tok); j++ {
			c := tok[j]
			if c == '~' {
				if j+1 == len(tok) || (tok[j+1] != '0' && tok[j+1] != '1') {
					return nil, fmt.Errorf("%w: key pointer %q has a bad \"~\" escape", ErrInvalidPolicy, pointer)
				}
				j++
				c = map[byte]byte{'0': '~', '1': '/'}[tok[j]]
			}
			b.WriteByte(c)
		}
		tokens[i] = b.String()
	}
	return tokens, nil
}

// arrayIndexToken is the form of an array index in the TypeScript
// original's resolveJsonPointer.
var arrayIndexToken = regexp.MustCompile(`^(0|[1-9][0-9]*)$`)

// resolvePointer follows tokens (as parsePointer returns them) through a
// decoded JSON document made of map[string]any, []any and scalars, as
// encoding/json decodes into an any, and reports the value it reaches and
// whether it reached one: the oracle jsjson.Resolve is checked against.
func resolvePointer(doc any, tokens []string) (any, bool) {
	cur := doc
	for _, tok := range tokens {
		switch v := cur.(type) {
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || !arrayIndexToken.MatchString(tok) || i >= len(v) {
				return nil, false
			}
			cur = v[i]
		case map[string]any:
			next, ok := v[tok]
			if !ok {
				return nil, false
			}
			cur = next
		default:
			return nil, false
		}
	}
	return cur, true
}
