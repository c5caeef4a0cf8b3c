package jobkeys

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// keyVector is one case of testdata/keyhash.json (from the TypeScript
// original) or of testdata/keyhash_extra.json (from internal/jsvectors/gen.mjs).
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
		require.NoError(t, err, "%s: bad payloadHex", v.Name)
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
		if !assert.ErrorIs(t, err, ErrInvalidKey, "%s: DeriveKey = %+v", v.Name, got) {
			return
		}
		switch string(v.Error) {
		case `"json"`:
			assert.Contains(t, err.Error(), "not valid JSON", v.Name)
		default: // a pointer did not resolve
			named := false
			for _, seg := range v.Template {
				named = named || strings.HasPrefix(seg, "/") && strings.Contains(err.Error(), fmt.Sprintf("%q", seg))
			}
			assert.True(t, named, "%s: error %q names none of the template's pointers", v.Name, err)
		}
		return
	}
	if !assert.NoError(t, err, v.Name) {
		return
	}
	wantKey := v.Key
	if v.KeyHex != "" {
		b, err := hex.DecodeString(v.KeyHex)
		require.NoError(t, err)
		wantKey = string(b)
	}
	want := JobKey{Service: v.Service, JobType: v.JobType, DisplayKey: wantKey, KeyHash: v.KeyHash, KVKey: v.KVKey}
	assert.Equal(t, want, got, v.Name)
}

func readKeyVectors(t *testing.T, path string) []keyVector {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var vs []keyVector
	require.NoError(t, json.Unmarshal(b, &vs), path)
	require.NotEmpty(t, vs, "%s: no vectors", path)
	return vs
}

// TestDeriveKeyTSVectors runs the vectors of the TypeScript original
// (vectors/keyhash.json of the shared vectors, copied into testdata).
func TestDeriveKeyTSVectors(t *testing.T) {
	t.Parallel()
	for _, v := range readKeyVectors(t, "testdata/keyhash.json") {
		v.check(t, v.payloadBytes(t))
		v.check(t, json.RawMessage(v.payloadBytes(t)))
	}
}

// tsVectorsSHA256 is the SHA-256 of the shared vectors/keyhash.json that
// testdata/keyhash.json copies. (This replaces a test that read the shared
// file from outside the repository and skipped in a fresh clone.)
const tsVectorsSHA256 = "ceb2e4f649e6cf9cbe8373b15087fda57134b601c36b17a9420bcc7fd01be1dc"

// TestDeriveKeyTSVectorsCopy checks that testdata/keyhash.json is the copy
// of the TypeScript original's vectors, byte for byte: vectors computed by
// Go must never replace them.
func TestDeriveKeyTSVectorsCopy(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("testdata/keyhash.json")
	require.NoError(t, err)
	sum := sha256.Sum256(b)
	assert.Equal(t, tsVectorsSHA256, hex.EncodeToString(sum[:]),
		"testdata/keyhash.json is not the TypeScript original's vectors/keyhash.json; copy it again (and update tsVectorsSHA256 only for a new version of those vectors)")
}

// jsVectors is the part of testdata/keyhash_extra.json, written by real
// JavaScript with internal/jsvectors/gen.mjs, that the key derivation's
// tests read: payloads, templates and the keys JavaScript derived (the
// number and string vectors are internal/jsjson's).
type jsVectors struct {
	Cases []keyVector `json:"cases"`
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

// TestDeriveKeyJSVectors runs the cases real JavaScript derived in
// internal/jsvectors/gen.mjs.
func TestDeriveKeyJSVectors(t *testing.T) {
	t.Parallel()
	v := loadJSVectors(t)
	require.GreaterOrEqual(t, len(v.Cases), 1000, "cases")
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
	assert.GreaterOrEqual(t, ran, 500, "vectors run as Go values")
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
		if !assert.NoError(t, err, tc.name) {
			continue
		}
		want, err := DeriveKey("svc", "job", []byte(tc.text), tc.template)
		require.NoError(t, err, tc.name)
		assert.Equal(t, want, got, tc.name)
	}
	_, err := DeriveKey("svc", "job", "{\"a\":1}", []string{"/a"})
	assert.ErrorIs(t, err, ErrInvalidKey, "a string payload is not parsed as JSON text")
	_, err = DeriveKey("svc", "job", map[string]any{"c": make(chan int)}, []string{"lit"})
	require.ErrorIs(t, err, ErrInvalidKey, "unmarshallable payload")
	assert.Contains(t, err.Error(), "cannot be encoded")
}

// deepValue returns a Go value that json.Marshal encodes depth arrays deep.
func deepValue(depth int) any {
	var v any = "leaf"
	for range depth {
		v = []any{v}
	}
	return v
}

// node is a recursive type whose values json.Marshal nests one object per
// level.
type node struct {
	Name string `json:"name"`
	Next *node  `json:"next,omitempty"`
}

func deepNodes(depth int) *node {
	n := &node{Name: "leaf"}
	for range depth - 1 {
		n = &node{Name: "n", Next: n}
	}
	return n
}

// TestDeriveKeyDepth is the regression test for a Go payload nested 10^6
// deep, which crashed the process (a stack overflow inside encoding/json, a
// fatal error no recover catches). Go values and JSON text nested up to
// MaxPayloadDepth derive keys; one level more is an error wrapping
// ErrInvalidKey that says the limit.
func TestDeriveKeyDepth(t *testing.T) {
	t.Parallel()
	type embedded struct{ Inner []any }
	type outer struct {
		embedded       // its fields are members of outer's object
		Tag      []any `json:"tag"`
	}
	textAt := func(depth int) []byte {
		return []byte(strings.Repeat("[", depth) + `"leaf"` + strings.Repeat("]", depth))
	}
	for _, tc := range []struct {
		name    string
		payload any
		depth   int // the nesting json.Marshal writes
	}{
		{"arrays", deepValue(MaxPayloadDepth), MaxPayloadDepth},
		{"arrays, one more", deepValue(MaxPayloadDepth + 1), MaxPayloadDepth + 1},
		{"arrays 10^6 deep", deepValue(1_000_000), 1_000_000},
		{"recursive type", deepNodes(MaxPayloadDepth), MaxPayloadDepth},
		{"recursive type, one more", deepNodes(MaxPayloadDepth + 1), MaxPayloadDepth + 1},
		{"map of any", map[string]any{"a": deepValue(MaxPayloadDepth - 1)}, MaxPayloadDepth},
		{"map of any, one more", map[string]any{"a": deepValue(MaxPayloadDepth)}, MaxPayloadDepth + 1},
		{"embedded struct", outer{embedded{[]any{deepValue(MaxPayloadDepth - 2)}}, nil}, MaxPayloadDepth},
		{"embedded struct, one more", outer{embedded{[]any{deepValue(MaxPayloadDepth - 1)}}, nil}, MaxPayloadDepth + 1},
		{"raw message inside a value", map[string]json.RawMessage{"a": textAt(MaxPayloadDepth)}, MaxPayloadDepth + 1},
		{"text", textAt(MaxPayloadDepth), MaxPayloadDepth},
		{"text, one more", textAt(MaxPayloadDepth + 1), MaxPayloadDepth + 1},
		{"text 10^6 deep", textAt(1_000_000), 1_000_000},
	} {
		_, err := DeriveKey("svc", "job", tc.payload, []string{"lit"})
		if tc.depth <= MaxPayloadDepth {
			assert.NoError(t, err, tc.name)
			continue
		}
		if assert.ErrorIs(t, err, ErrInvalidKey, tc.name) {
			assert.Contains(t, err.Error(), fmt.Sprintf("deeper than %d", MaxPayloadDepth), tc.name)
		}
	}
	// A value that points to itself without nesting is refused too (json.Marshal
	// would report a cycle; the depth check must not recurse forever first).
	var loop any
	loop = &loop
	_, err := DeriveKey("svc", "job", loop, []string{"lit"})
	require.ErrorIs(t, err, ErrInvalidKey)
	assert.Contains(t, err.Error(), "points to itself")
	// The checks agree with what json.Marshal writes.
	text, err := json.Marshal(outer{embedded{[]any{deepValue(3)}}, nil})
	require.NoError(t, err)
	assert.Equal(t, `{"Inner":[[[["leaf"]]]],"tag":null}`, string(text))
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
		if !assert.ErrorIs(t, err, tc.sentinel, tc.name) {
			continue
		}
		for _, s := range tc.contains {
			assert.Contains(t, err.Error(), s, tc.name)
		}
	}
}

func TestDeriveKeyNameValidation(t *testing.T) {
	t.Parallel()
	good := []string{"svc", "A-Z_a-z_0-9", "x", strings.Repeat("s", MaxServiceLength)}
	goodJobTypes := []string{"a=b", "a/b", "=/", "svc", "x", strings.Repeat("j", MaxJobTypeLength)}
	bad := []string{"", "a.b", ".", "a b", " ", "*", "a*", ">", "a>", "é", "日本", "a\x00", "a\tb", "a\xff", "a~b", "a$b"}
	for _, s := range good {
		assert.NoError(t, validateService(s), "validateService(%q)", s)
	}
	for _, s := range goodJobTypes {
		assert.NoError(t, validateJobType(s), "validateJobType(%q)", s)
	}
	for _, s := range append([]string{"a=b", "a/b", strings.Repeat("s", MaxServiceLength+1)}, bad...) {
		err := validateService(s)
		if assert.ErrorIs(t, err, ErrInvalidName, "validateService(%q)", s) {
			assert.Contains(t, err.Error(), "service")
		}
		// Names are checked first: a payload that is not even JSON and a
		// bad template do not matter.
		_, err = DeriveKey(s, "job", []byte("not json"), []string{"/a~2"})
		assert.ErrorIs(t, err, ErrInvalidName, "DeriveKey(service %q)", s)
	}
	for _, s := range append([]string{strings.Repeat("j", MaxJobTypeLength+1)}, bad...) {
		err := validateJobType(s)
		if assert.ErrorIs(t, err, ErrInvalidName, "validateJobType(%q)", s) {
			assert.Contains(t, err.Error(), "job type")
		}
		_, err = DeriveKey("svc", s, []byte("not json"), []string{"/a~2"})
		assert.ErrorIs(t, err, ErrInvalidName, "DeriveKey(job type %q)", s)
	}
	err := validateJobType("a.b")
	for _, s := range []string{`"a.b"`, `'.'`, "byte 1"} {
		assert.Contains(t, err.Error(), s)
	}
	assert.Contains(t, validateService("日本").Error(), `'日'`, "the error shows the bad character")
	err = validateJobType(strings.Repeat("j", 4000))
	assert.Contains(t, err.Error(), "4000 bytes")
	assert.Contains(t, err.Error(), fmt.Sprint(MaxJobTypeLength))
	assert.Less(t, len(err.Error()), 200, "the error does not repeat a long name in full")
}

// TestNamesAtTheLimitEndToEnd is the regression test for names so long that
// a request's protocol line exceeds the server's 4 KiB control-line limit
// (a 4,000-character job type made the server close the connection of
// every coordinator, heartbeat and watcher on it). On a real server, a
// service and a job type at their limits admit, acquire, watch and release
// over a connection that stays up; one byte more is refused with
// ErrInvalidName before anything is sent.
func TestNamesAtTheLimitEndToEnd(t *testing.T) {
	t.Parallel()
	srv := natstest.Run(t)
	nc, js := natstest.Connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := NewNATSStore(js, WithCreateBuckets(jetstream.MemoryStorage, 1))
	require.NoError(t, err)
	coord, err := NewCoordinator(st, nil)
	require.NoError(t, err)

	service := strings.Repeat("s", MaxServiceLength)
	jobType := strings.Repeat("j", MaxJobTypeLength-2) + "=/"
	policy := Policy{Key: []string{"tenant", "/tenant"}}
	payload := []byte(`{"tenant":"acme"}`)

	adm, err := coord.Admit(ctx, AdmitRequest{Service: service, JobType: jobType, JobID: "j1", Payload: payload, Policy: policy})
	require.NoError(t, err)
	require.Equal(t, KindAccepted, adm.Kind)

	key, err := DeriveKey(service, jobType, payload, policy.Key)
	require.NoError(t, err)
	kv, err := st.KeyValue(ctx, service)
	require.NoError(t, err)
	w, err := kv.Watch(ctx, key.KVKey) // creates a consumer filtered on the key: the longest request line
	require.NoError(t, err)
	defer func() { assert.NoError(t, w.Stop()) }()
	select {
	case e := <-w.Updates():
		require.NotNil(t, e, "the watch sees the admitted state")
		assert.Equal(t, key.KVKey, e.Key())
	case <-ctx.Done():
		require.Fail(t, "no update from the watch")
	}

	acq, err := coord.Acquire(ctx, AcquireRequest{Service: service, JobType: jobType, JobID: "j1", Payload: payload, Policy: policy})
	require.NoError(t, err)
	require.Equal(t, KindAcquired, acq.Kind)
	rel, err := coord.Release(ctx, ReleaseRequest{Lease: acq.Lease})
	require.NoError(t, err)
	require.Equal(t, KindReleased, rel.Kind)
	require.NoError(t, nc.Flush())
	assert.True(t, nc.IsConnected(), "the connection stays up")
	assert.EqualValues(t, 0, nc.Stats().Reconnects, "the server never closed the connection")

	for _, tc := range []struct{ what, service, jobType string }{
		{"service", service + "s", jobType},
		{"job type", service, jobType + "j"},
		{"job type", "svc", strings.Repeat("j", 4000)}, // what closed the connection
	} {
		_, err := coord.Admit(ctx, AdmitRequest{Service: tc.service, JobType: tc.jobType, JobID: "j2", Payload: payload, Policy: policy})
		require.ErrorIs(t, err, ErrInvalidName, tc.what)
		assert.Contains(t, err.Error(), tc.what)
		assert.Contains(t, err.Error(), "more than the")
	}
	_, _, err = st.Get(ctx, service+"s", "k")
	assert.ErrorIs(t, err, ErrInvalidName, "NATSStore refuses a service over the limit")
	require.NoError(t, nc.Flush())
	assert.True(t, nc.IsConnected(), "the connection stays up (status %v)", nc.Status())
	assert.EqualValues(t, 0, nc.Stats().Reconnects)
}

func TestKVKeyFor(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "svc.a=b/c.00ff", kvKeyFor("svc", "a=b/c", "00ff"))
	k, err := DeriveKey("svc", "job", []byte(`{}`), []string{"x"})
	require.NoError(t, err)
	assert.Equal(t, kvKeyFor(k.Service, k.JobType, k.KeyHash), k.KVKey)
}

// raceEnabled reports whether the test binary was built with -race.
func raceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// TestDeriveKeyAllocs holds DeriveKey to its allocation budget for JSON text
// payloads: the display key and the KV key (KeyHash shares its bytes).
func TestDeriveKeyAllocs(t *testing.T) {
	if raceEnabled() {
		// The race detector makes sync.Pool drop items at random, and
		// json.Valid takes its scanner from a pool.
		t.Skip("allocations are not representative under -race")
	}
	// Boxed once: converting a slice to an any allocates at the call site.
	var payload any = []byte(`{"tenant":{"id":"acme","region":"eu-west-1"},"n":42.5,"b":true,"pad":[1,2,3,{"x":"y"}]}`)
	template := []string{"tenant", "/tenant/id", "/tenant/region", "/n", "/b"}
	allocs := testing.AllocsPerRun(100, func() {
		_, err := DeriveKey("svc", "job", payload, template)
		require.NoError(t, err)
	})
	assert.LessOrEqual(t, allocs, 2.0, "allocations per call")
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
	type doc struct {
		ID  string `json:"id"`
		Rev int    `json:"rev"`
	}
	type job struct {
		Tenant string   `json:"tenant"`
		Doc    doc      `json:"doc"`
		Flag   bool     `json:"flag"`
		Tags   []string `json:"tags"`
	}
	var structValue any = job{"acme", doc{"d-123", 17}, true, []string{"a", "b"}}

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
	b.Run("go-struct", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DeriveKey("svc", "job", structValue, smallTemplate); err != nil {
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
