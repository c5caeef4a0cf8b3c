package jobkeys

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// keyVector is one case of vectors/keyhash.json (from the TS original) or of
// testdata/keyhash_extra.json (from internal/jsvectors/gen.mjs).
type keyVector struct {
	Name       string          `json:"name"`
	Service    string          `json:"service"`
	JobType    string          `json:"jobType"`
	Payload    string          `json:"payload"`
	PayloadHex string          `json:"payloadHex"`
	Template   []string        `json:"template"`
	Key        string          `json:"key"`
	KeyHex     string          `json:"keyHex"`
	KeyHash    string          `json:"keyHash"`
	KVKey      string          `json:"kvKey"`
	Error      json.RawMessage `json:"error"`
}

func (v keyVector) payloadBytes(t testing.TB) []byte {
	t.Helper()
	if v.PayloadHex != "" {
		b, err := hex.DecodeString(v.PayloadHex)
		if err != nil {
			t.Fatalf("%s: bad payloadHex: %v", v.Name, err)
		}
		return b
	}
	return []byte(v.Payload)
}

func (v keyVector) wantError() bool {
	return len(v.Error) > 0 && string(v.Error) != "false" && string(v.Error) != "null"
}

// check derives the vector's key from payload and compares.
func (v keyVector) check(t *testing.T, payload any) {
	t.Helper()
	got, err := DeriveKey(v.Service, v.JobType, payload, v.Template)
	if v.wantError() {
		if err == nil {
			t.Errorf("%s: DeriveKey = %+v, want an error", v.Name, got)
			return
		}
		if !errors.Is(err, ErrInvalidKey) {
			t.Errorf("%s: error %v does not wrap ErrInvalidKey", v.Name, err)
		}
		switch string(v.Error) {
		case `"json"`:
			if !strings.Contains(err.Error(), "not valid JSON") {
				t.Errorf("%s: error %q does not say the payload is not valid JSON", v.Name, err)
			}
		default: // a pointer did not resolve
			named := false
			for _, seg := range v.Template {
				named = named || strings.HasPrefix(seg, "/") && strings.Contains(err.Error(), fmt.Sprintf("%q", seg))
			}
			if !named {
				t.Errorf("%s: error %q names none of the template's pointers", v.Name, err)
			}
		}
		return
	}
	if err != nil {
		t.Errorf("%s: DeriveKey: %v", v.Name, err)
		return
	}
	wantKey := v.Key
	if v.KeyHex != "" {
		b, err := hex.DecodeString(v.KeyHex)
		if err != nil {
			t.Fatal(err)
		}
		wantKey = string(b)
	}
	want := JobKey{Service: v.Service, JobType: v.JobType, Key: wantKey, KeyHash: v.KeyHash, KVKey: v.KVKey}
	if got != want {
		t.Errorf("%s:\n got  %+q\n want %+q", v.Name, got, want)
	}
}

func readKeyVectors(t *testing.T, path string) []keyVector {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var vs []keyVector
	if err := json.Unmarshal(b, &vs); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if len(vs) == 0 {
		t.Fatalf("%s: no vectors", path)
	}
	return vs
}

// TestDeriveKeyTSVectors runs the vectors from the TS original, copied into
// testdata so that a fresh clone can run them.
func TestDeriveKeyTSVectors(t *testing.T) {
	t.Parallel()
	for _, v := range readKeyVectors(t, "testdata/keyhash.json") {
		v.check(t, v.payloadBytes(t))
		v.check(t, json.RawMessage(v.payloadBytes(t)))
	}
}

// TestDeriveKeyTSVectorsShared runs the shared vectors where they are checked
// out next to the repository, and checks that the copy in testdata is current.
func TestDeriveKeyTSVectorsShared(t *testing.T) {
	t.Parallel()
	const shared = "../shared/vectors/keyhash.json"
	orig, err := os.ReadFile(shared)
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("%s not present", shared)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range readKeyVectors(t, shared) {
		v.check(t, v.payloadBytes(t))
	}
	local, err := os.ReadFile("testdata/keyhash.json")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(orig, local) {
		t.Errorf("testdata/keyhash.json differs from %s: copy it again", shared)
	}
}

// TestDeriveKeyJSVectors runs the cases real JavaScript derived in
// internal/jsvectors/gen.mjs.
func TestDeriveKeyJSVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	if len(v.Cases) < 1000 {
		t.Fatalf("only %d cases", len(v.Cases))
	}
	for _, c := range v.Cases {
		c.check(t, c.payloadBytes(t))
	}
}

// surrogateEscape matches a \u escape of a surrogate, which encoding/json
// decodes differently from JavaScript when it is not part of a pair.
var surrogateEscape = regexp.MustCompile(`\\u[dD][89a-fA-F]`)

// TestDeriveKeyJSVectorsGoValues passes the vectors' payloads as Go values
// decoded by encoding/json, which DeriveKey marshals again. Payloads that
// encoding/json cannot carry unchanged (lone surrogates, invalid UTF-8,
// numbers beyond float64) are skipped.
func TestDeriveKeyJSVectorsGoValues(t *testing.T) {
	t.Parallel()
	ran := 0
	for _, c := range loadJSVectors(t).Cases {
		p := c.payloadBytes(t)
		if c.wantError() || !utf8.Valid(p) || surrogateEscape.Match(p) {
			continue
		}
		var doc any
		if err := json.Unmarshal(p, &doc); err != nil {
			continue // a number out of float64 range, or a BOM
		}
		c.check(t, doc)
		ran++
	}
	if ran < 500 {
		t.Errorf("only %d vectors ran as Go values", ran)
	}
}

func TestDeriveKeyGoValues(t *testing.T) {
	t.Parallel()
	type tenant struct {
		ID     string  `json:"id"`
		Region string  `json:"region"`
		Weight float32 `json:"weight"`
		Count  uint64  `json:"count"`
	}
	// Expected keys are those of the equivalent JSON text, whose derivation
	// the vector tests check against JavaScript.
	for _, tc := range []struct {
		name     string
		payload  any
		text     string
		template []string
	}{
		{"struct", struct {
			Tenant tenant `json:"tenant"`
		}{tenant{"acme", "eu", 0.1, 12345678901234567890}}, `{"tenant":{"id":"acme","region":"eu","weight":0.1,"count":12345678901234567890}}`,
			[]string{"/tenant/id", "/tenant/region", "/tenant/weight", "/tenant/count"}},
		{"map", map[string]any{"a": []any{1, "x", true}, "<&>": "html"}, `{"a":[1,"x",true],"<&>":"html"}`,
			[]string{"/a/0", "/a/1", "/a/2", "/<&>"}},
		{"raw message in map", map[string]json.RawMessage{"n": json.RawMessage(`1e2`)}, `{"n":100}`, []string{"/n"}},
		{"json number", map[string]json.Number{"n": "0.10"}, `{"n":0.1}`, []string{"/n"}},
		{"string payload is a JSON string", "{\"a\":1}", `"{\"a\":1}"`, []string{"lit"}},
		{"nil payload is null", nil, `null`, []string{"lit"}},
	} {
		got, err := DeriveKey("svc", "job", tc.payload, tc.template)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		want, err := DeriveKey("svc", "job", []byte(tc.text), tc.template)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got != want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, want)
		}
	}
	if _, err := DeriveKey("svc", "job", "{\"a\":1}", []string{"/a"}); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("a string payload is not parsed as JSON text: got %v", err)
	}
	_, err := DeriveKey("svc", "job", map[string]any{"c": make(chan int)}, []string{"lit"})
	if !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), "cannot be encoded") {
		t.Errorf("unmarshallable payload: got %v", err)
	}
}

func TestDeriveKeyErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		payload  string
		template []string
		sentinel error
		contains []string
	}{
		{"missing", `{}`, []string{"/nope"}, ErrInvalidKey, []string{`"/nope"`, "nothing"}},
		{"null", `{"a":null}`, []string{"/a"}, ErrInvalidKey, []string{`"/a"`, "null"}},
		{"object", `{"a":{}}`, []string{"/a"}, ErrInvalidKey, []string{`"/a"`, "an object"}},
		{"array", `{"a":[]}`, []string{"/a"}, ErrInvalidKey, []string{`"/a"`, "an array"}},
		{"infinity", `{"a":1e400}`, []string{"/a"}, ErrInvalidKey, []string{`"/a"`, "non-finite", "1e400"}},
		{"negative infinity", `{"a":-1e400}`, []string{"x", "/a"}, ErrInvalidKey, []string{`"/a"`, "non-finite"}},
		{"second pointer named", `{"a":1}`, []string{"/a", "/b"}, ErrInvalidKey, []string{`"/b"`}},
		{"empty payload", ``, []string{"lit"}, ErrInvalidKey, []string{"not valid JSON", "end of JSON"}},
		{"trailing comma", `{"a":1,}`, []string{"/a"}, ErrInvalidKey, []string{"not valid JSON", `'}'`, "byte 7"}},
		{"bad pointer escape", `{"a~2":1}`, []string{"/a~2"}, ErrInvalidPolicy, []string{`"/a~2"`, "~"}},
		{"pointer ends in ~", `{}`, []string{"/a~"}, ErrInvalidPolicy, []string{`"/a~"`}},
		{"template not UTF-8", `{}`, []string{"ok", "\xff"}, ErrInvalidPolicy, []string{"segment 1", "UTF-8"}},
		{"template WTF-8", `{}`, []string{"\xed\xa0\x80"}, ErrInvalidPolicy, []string{"UTF-8"}},
		{"template checked before payload", `not json`, []string{"lit", "/a~2"}, ErrInvalidPolicy, []string{`"/a~2"`}},
	} {
		_, err := DeriveKey("svc", "job", []byte(tc.payload), tc.template)
		if !errors.Is(err, tc.sentinel) {
			t.Errorf("%s: error %v does not wrap %v", tc.name, err, tc.sentinel)
			continue
		}
		for _, s := range tc.contains {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not contain %q", tc.name, err, s)
			}
		}
	}
}

func TestDeriveKeyNameValidation(t *testing.T) {
	t.Parallel()
	good := []string{"svc", "A-Z_a-z_0-9", "x"}
	goodJobTypes := append([]string{"a=b", "a/b", "=/"}, good...)
	bad := []string{"", "a.b", ".", "a b", " ", "*", "a*", ">", "a>", "é", "日本", "a\x00", "a\tb", "a\xff", "a~b", "a$b"}
	for _, s := range good {
		if err := validateService(s); err != nil {
			t.Errorf("validateService(%q): %v", s, err)
		}
	}
	for _, s := range goodJobTypes {
		if err := validateJobType(s); err != nil {
			t.Errorf("validateJobType(%q): %v", s, err)
		}
	}
	for _, s := range append([]string{"a=b", "a/b"}, bad...) {
		err := validateService(s)
		if !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "service") {
			t.Errorf("validateService(%q) = %v, want an ErrInvalidName naming the service", s, err)
		}
		// Names are checked first: a payload that is not even JSON and a
		// bad template do not matter.
		_, err = DeriveKey(s, "job", []byte("not json"), []string{"/a~2"})
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("DeriveKey(service %q) = %v, want ErrInvalidName", s, err)
		}
	}
	for _, s := range bad {
		err := validateJobType(s)
		if !errors.Is(err, ErrInvalidName) || !strings.Contains(err.Error(), "job type") {
			t.Errorf("validateJobType(%q) = %v, want an ErrInvalidName naming the job type", s, err)
		}
		_, err = DeriveKey("svc", s, []byte("not json"), []string{"/a~2"})
		if !errors.Is(err, ErrInvalidName) {
			t.Errorf("DeriveKey(job type %q) = %v, want ErrInvalidName", s, err)
		}
	}
	err := validateJobType("a.b")
	for _, s := range []string{`"a.b"`, `'.'`, "byte 1"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not contain %q", err, s)
		}
	}
	if err := validateService("日本"); !strings.Contains(err.Error(), `'日'`) {
		t.Errorf("error %q does not show the bad character", err)
	}
}

func TestKVKeyFor(t *testing.T) {
	t.Parallel()
	if got := kvKeyFor("svc", "a=b/c", "00ff"); got != "svc.a=b/c.00ff" {
		t.Errorf("kvKeyFor = %q", got)
	}
	k, err := DeriveKey("svc", "job", []byte(`{}`), []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	if k.KVKey != kvKeyFor(k.Service, k.JobType, k.KeyHash) {
		t.Errorf("KVKey %q is not kvKeyFor of its parts", k.KVKey)
	}
}

// TestDeriveKeyAllocs holds DeriveKey to its allocation budget for JSON text
// payloads: the display key and the KV key (KeyHash shares its bytes).
func TestDeriveKeyAllocs(t *testing.T) {
	// Boxed once: converting a slice to an any allocates at the call site.
	var payload any = []byte(`{"tenant":{"id":"acme","region":"eu-west-1"},"n":42.5,"b":true,"pad":[1,2,3,{"x":"y"}]}`)
	template := []string{"tenant", "/tenant/id", "/tenant/region", "/n", "/b"}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := DeriveKey("svc", "job", payload, template); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 2 {
		t.Errorf("DeriveKey allocates %v times per call, want at most 2", allocs)
	}
}

func BenchmarkDeriveKey(b *testing.B) {
	var small any = []byte(`{"tenant":"acme","doc":{"id":"d-123","rev":17},"flag":true}`)
	smallTemplate := []string{"doc", "/tenant", "/doc/id", "/doc/rev", "/flag"}
	var big bytes.Buffer
	big.WriteString(`{"items":[`)
	for i := range 200 {
		if i > 0 {
			big.WriteByte(',')
		}
		fmt.Fprintf(&big, `{"id":%d,"name":"item \u00e9 %d","tags":["a","b"]}`, i, i)
	}
	big.WriteString(`],"tenant":"acme"}`)
	bigTemplate := []string{"/tenant", "/items/199/name"}
	var bigPayload any = big.Bytes()
	value := map[string]any{"tenant": "acme", "doc": map[string]any{"id": "d-123", "rev": 17}, "flag": true}

	b.Run("bytes-small", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DeriveKey("svc", "job", small, smallTemplate); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("bytes-16KiB", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(big.Len()))
		for b.Loop() {
			if _, err := DeriveKey("svc", "job", bigPayload, bigTemplate); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("go-value", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DeriveKey("svc", "job", value, smallTemplate); err != nil {
				b.Fatal(err)
			}
		}
	})
	// Baselines: what the work costs with encoding/json decoding the payload
	// into an any, and the SHA-256 alone.
	b.Run("baseline-unmarshal-small", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var doc any
			if err := json.Unmarshal(small.([]byte), &doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-unmarshal-16KiB", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(big.Len()))
		for b.Loop() {
			var doc any
			if err := json.Unmarshal(big.Bytes(), &doc); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("baseline-sha256", func(b *testing.B) {
		b.ReportAllocs()
		text := []byte(`{"version":1,"segments":["doc","acme","d-123",17,true]}`)
		for b.Loop() {
			_ = sha256.Sum256(text)
		}
	})
}
