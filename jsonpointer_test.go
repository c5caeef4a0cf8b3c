package jobkeys

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParsePointer(t *testing.T) {
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
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parsePointer(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if err := checkPointer(tc.in); err != nil {
			t.Errorf("checkPointer(%q): %v", tc.in, err)
		}
	}
	for _, in := range []string{"", "a", "a/b", "~0", "/~", "/a~", "/~2", "/a~b", "/~~0", "/ok/~x"} {
		_, err := parsePointer(in)
		if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), strconv.Quote(in)) {
			t.Errorf("parsePointer(%q) = %v, want an ErrInvalidPolicy naming the pointer", in, err)
		}
		if err := checkPointer(in); !errors.Is(err, ErrInvalidPolicy) {
			t.Errorf("checkPointer(%q) = %v, want ErrInvalidPolicy", in, err)
		}
	}
}

func TestResolvePointer(t *testing.T) {
	t.Parallel()
	var doc any
	const text = `{"":{"":"deep"},"a":[10,"x",[true],{"k":null}],"a/b":{"m~n":"v"},"0":"zero","s":"str","n":1.5}`
	if err := json.Unmarshal([]byte(text), &doc); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		pointer string
		want    any
		ok      bool
	}{
		{"/", map[string]any{"": "deep"}, true},
		{"//", "deep", true},
		{"/a/0", 10.0, true},
		{"/a/1", "x", true},
		{"/a/2/0", true, true},
		{"/a/3/k", nil, true}, // null resolves: it is a value, just not a key segment
		{"/a/4", nil, false},
		{"/a/01", nil, false},
		{"/a/-", nil, false},
		{"/a/-0", nil, false},
		{"/a/+1", nil, false},
		{"/a/1e0", nil, false},
		{"/a/ 1", nil, false},
		{"/a/99999999999999999999999", nil, false},
		{"/a/length", nil, false},
		{"/a/", nil, false},
		{"/a~1b/m~0n", "v", true},
		{"/0", "zero", true},
		{"/s/0", nil, false},
		{"/s/length", nil, false},
		{"/n/x", nil, false},
		{"/a/3/k/x", nil, false},
		{"/constructor", nil, false},
		{"/__proto__", nil, false},
	} {
		tokens, err := parsePointer(tc.pointer)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := resolvePointer(doc, tokens)
		if ok != tc.ok || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("resolvePointer(%q) = %v, %v; want %v, %v", tc.pointer, got, ok, tc.want, tc.ok)
		}
		checkResolveTextAgrees(t, []byte(text), tc.pointer)
	}
	if got, ok := resolvePointer("scalar", []string{"x"}); ok || got != nil {
		t.Errorf("into a scalar: %v, %v", got, ok)
	}
	if got, ok := resolvePointer(42.0, nil); !ok || got != 42.0 {
		t.Errorf("no tokens: %v, %v", got, ok)
	}
}

// checkResolveTextAgrees checks that resolveText finds in text what
// resolvePointer finds in text decoded by encoding/json. text must be valid
// UTF-8 without surrogate escapes, where the two decoders agree.
func checkResolveTextAgrees(t testing.TB, text []byte, pointer string) {
	t.Helper()
	tokens, err := parsePointer(pointer)
	if err != nil {
		t.Fatalf("parsePointer(%q): %v", pointer, err)
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		t.Fatalf("decoding %q: %v", text, err)
	}
	want, wantOK := resolvePointer(doc, tokens)
	pos, ok, _ := resolveText(text, pointer, nil)
	if ok != wantOK {
		t.Fatalf("resolveText(%q, %q) found %v, resolvePointer found %v", text, pointer, ok, wantOK)
	}
	if !ok {
		return
	}
	raw := text[pos:valueEnd(text, pos)]
	var got any
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("resolveText(%q, %q) stopped at %q: %v", text, pointer, raw, err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("resolveText(%q, %q) = %q, resolvePointer = %v", text, pointer, raw, want)
	}
	if s, isString := want.(string); isString {
		if v := appendStringValue(nil, raw[1:len(raw)-1]); string(v) != s {
			t.Fatalf("appendStringValue(%s) = %q, encoding/json = %q", raw, v, s)
		}
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
	if ran < 500 {
		t.Errorf("only %d pointers checked", ran)
	}
}

func TestJSONTextCheck(t *testing.T) {
	t.Parallel()
	valid := []string{
		`0`, `-0`, `1.5e-3`, `1E+2`, `true`, `false`, `null`, `""`, `"\u00e9\ud800\/"`,
		` {} `, `[]`, `[[]]`, `{"a":[1,{"b":null}],"c":"d"}`, "\t\r\n [ 1 , 2 ] \t\r\n",
		"\"\xff\xfe\"", // invalid UTF-8 inside a string reads as U+FFFD
	}
	invalid := []string{
		``, ` `, `{`, `[`, `]`, `{]`, `[}`, `{"a"}`, `{"a":}`, `{"a":1,}`, `[1,]`, `[,]`, `{,}`,
		`01`, `-`, `-a`, `1.`, `.1`, `1e`, `1e+`, `+1`, `0x1`, `NaN`, `Infinity`, `tru`, `nul`, `falsey`,
		`"abc`, `"\x"`, `"\u12"`, `"\u12x4"`, "\"\t\"", "\"\x00\"", `{'a':1}`, `{a:1}`, `[1 2]`,
		`1 2`, `{} {}`, "\xef\xbb\xbf{}", "\xff", "[\xff]", "\u00a0{}", "\f{}", "{}\x00",
		strings.Repeat("[", 1000),
	}
	for _, s := range valid {
		if err := checkJSONText([]byte(s)); err != nil {
			t.Errorf("checkJSONText(%.40q): %v", s, err)
		}
		if !json.Valid([]byte(s)) {
			t.Errorf("encoding/json disagrees on %.40q", s)
		}
	}
	// JSON.parse has no nesting limit (encoding/json stops at 10000).
	deep := strings.Repeat(`[{"a":`, 100000) + "1" + strings.Repeat("}]", 100000)
	if err := checkJSONText([]byte(deep)); err != nil {
		t.Errorf("checkJSONText(deep): %v", err)
	}
	deep = strings.Repeat(`[{"a":`, 2000) + "1" + strings.Repeat("}]", 2000)
	if pos, ok, _ := resolveText([]byte(deep), strings.Repeat("/0/a", 2000), nil); !ok || deep[pos] != '1' {
		t.Errorf("resolveText(deep) = %d, %v", pos, ok)
	}
	for _, s := range invalid {
		if err := checkJSONText([]byte(s)); err == nil {
			t.Errorf("checkJSONText(%.40q) accepted it", s)
		}
		if json.Valid([]byte(s)) {
			t.Errorf("encoding/json disagrees on %.40q", s)
		}
	}
}

// TestJSONNumberTextVectors checks that number literals read as the doubles
// JSON.parse reads them as, and print as String() prints them.
func TestJSONNumberTextVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	for _, n := range v.NumberTexts {
		text := []byte(n.Text)
		if err := checkJSONText(text); err != nil {
			t.Errorf("checkJSONText(%.40s): %v", n.Text, err)
			continue
		}
		f, _ := strconv.ParseFloat(string(text[:valueEnd(text, 0)]), 64)
		want := bitsToFloat(t, n.Bits)
		if math.Float64bits(f) != math.Float64bits(want) {
			t.Errorf("%.40s reads as %v, JSON.parse reads %v", n.Text, f, want)
		}
		if got := string(appendJSNumber(nil, f)); got != n.String {
			t.Errorf("%.40s prints as %q, JavaScript prints %q", n.Text, got, n.String)
		}
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
		if got := appendStringValue([]byte("x"), []byte(tc.raw)); string(got) != "x"+tc.want {
			t.Errorf("appendStringValue(%q) = %q, want %q", tc.raw, got[1:], tc.want)
		}
	}
}
