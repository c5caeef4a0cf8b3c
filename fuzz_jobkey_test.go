package jobkeys

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// The fuzz targets run their seeds (f.Add and testdata/fuzz/<Name>) as
// ordinary tests under go test; go test -fuzz=FuzzDeriveKey explores further.

// encodingJSONAgrees reports whether encoding/json decodes text as
// JavaScript does, so that it can serve as an oracle: valid UTF-8, no
// surrogate escapes, no byte order mark and nesting within its limit.
func encodingJSONAgrees(text []byte) bool {
	return utf8.Valid(text) && !surrogateEscape.Match(text) && !bytes.HasPrefix(text, []byte("\xef\xbb\xbf")) &&
		bytes.Count(text, []byte("["))+bytes.Count(text, []byte("{")) < 9000
}

func FuzzResolvePointer(f *testing.F) {
	for _, seed := range []struct{ text, pointer string }{
		{`{"a":[1,{"b":"c"}]}`, "/a/1/b"},
		{`{"":{"":"deep"}}`, "//"},
		{`{"a/b":{"m~n":"v"}}`, "/a~1b/m~0n"},
		{`{"a":1,"a":2}`, "/a"},
		{`{"caf\u00e9":"x","\ud800":"lone"}`, "/café"},
		{`[10,20,30]`, "/01"},
		{`[10,20,30]`, "/2"},
		{`{"x":"}\"]"  ,  "y" : [ {} , [] ]}`, "/y/1"},
		{"\xef\xbb\xbf{\"a\":true}", "/a"},
		{`{"a":1e400}`, "/a"},
		{`{"a":1,}`, "/a"},
		{`{"a~2":1}`, "/a~2"},
	} {
		f.Add([]byte(seed.text), seed.pointer)
	}
	f.Fuzz(func(t *testing.T, data []byte, pointer string) {
		_, perr := parsePointer(pointer)
		cerr := checkPointer(pointer)
		require.Equal(t, perr == nil, cerr == nil, "checkPointer(%q) = %v but parsePointer = %v", pointer, cerr, perr)
		if perr != nil {
			require.ErrorIs(t, perr, ErrInvalidPolicy, "parsePointer(%q)", pointer)
		}
		text := jsjson.TrimBOM(data)
		err := jsjson.CheckText(text)
		require.False(t, encodingJSONAgrees(data) && (err == nil) != json.Valid(data), "jsjson.CheckText(%q) = %v, json.Valid = %v", data, err, json.Valid(data))
		if err != nil || perr != nil {
			return
		}
		pos, ok := jsjson.Resolve(text, pointer)
		if ok {
			require.NoError(t, jsjson.CheckText(text[pos:jsjson.ValueEnd(text, pos)]), "jsjson.Resolve(%q, %q) stopped inside a value", text, pointer)
		}
		if encodingJSONAgrees(text) {
			checkResolveTextAgrees(t, text, pointer)
		}
	})
}

var lowerHex64 = regexp.MustCompile(`^[0-9a-f]{64}$`)

// oracleKey derives the key of payload under template with encoding/json
// decoding the payload, where encodingJSONAgrees says it can. ok is false
// where a pointer does not resolve to a key segment.
func oracleKey(t *testing.T, text []byte, template []string) (key, keyHash string, ok bool) {
	dec := json.NewDecoder(bytes.NewReader(text))
	dec.UseNumber()
	var doc any
	require.NoError(t, dec.Decode(&doc), "encoding/json cannot decode %q", text)
	var keyParts []string
	hashed := []byte(`{"version":1,"segments":[`)
	for i, seg := range template {
		if i > 0 {
			hashed = append(hashed, ',')
		}
		if !strings.HasPrefix(seg, "/") {
			keyParts = append(keyParts, seg)
			hashed = jsjson.AppendString(hashed, seg)
			continue
		}
		tokens, err := parsePointer(seg)
		require.NoError(t, err)
		v, found := resolvePointer(doc, tokens)
		if !found {
			return "", "", false
		}
		switch v := v.(type) {
		case string:
			keyParts = append(keyParts, v)
			hashed = jsjson.AppendString(hashed, v)
		case bool:
			keyParts = append(keyParts, strconv.FormatBool(v))
			hashed = strconv.AppendBool(hashed, v)
		case json.Number:
			f, _ := strconv.ParseFloat(string(v), 64)
			if math.IsInf(f, 0) {
				return "", "", false
			}
			s := string(jsjson.AppendNumber(nil, f))
			keyParts = append(keyParts, s)
			hashed = append(hashed, s...)
		default:
			return "", "", false
		}
	}
	sum := sha256.Sum256(append(hashed, "]}"...))
	return strings.Join(keyParts, ":"), hex.EncodeToString(sum[:]), true
}

func FuzzDeriveKey(f *testing.F) {
	for _, seed := range []struct{ payload, template string }{
		{`{"t":"tenant","s":"zendesk","n":42,"b":true}`, "/t,/s,/n,/b"},
		{`{"v":0.1,"w":1e21,"x":1e-7,"y":-0,"z":12345678901234567890}`, "/v,/w,/x,/y,/z"},
		{`{"v":"\ud800\ud83d\ude00\u2028<>&\u007f\u0000"}`, "pre,/v"},
		{`{"v":"a\"b\\c"}`, "lit\"eral,/v"},
		{`{"":{"":"deep"}}`, "//,/"},
		{`{"a":[1,2]}`, "/a/01"},
		{`{"a":null}`, "/a"},
		{`{"a":1e400}`, "/a"},
		{"{\"v\":\"\xff\xe2\x82\"}", "/v"},
		{`not json`, "lit"},
		{`{}`, ""},
		{`{"café":true}`, "/café,:,/"},
	} {
		f.Add([]byte(seed.payload), seed.template)
	}
	f.Fuzz(func(t *testing.T, payload []byte, templateText string) {
		template := strings.Split(templateText, ",")
		k, err := DeriveKey("svc", "job", payload, template)
		if err != nil {
			require.True(t, errors.Is(err, ErrInvalidKey) || errors.Is(err, ErrInvalidPolicy), "error %v wraps neither ErrInvalidKey nor ErrInvalidPolicy", err)
		}
		k2, err2 := DeriveKey("svc", "job", json.RawMessage(payload), template)
		require.False(t, k2 != k || (err2 == nil) != (err == nil) || (err != nil && err.Error() != err2.Error()), "not deterministic: %+v, %v then %+v, %v", k, err, k2, err2)
		policyOK := true
		for _, seg := range template {
			policyOK = policyOK && utf8.ValidString(seg) && (!strings.HasPrefix(seg, "/") || checkPointer(seg) == nil)
		}
		text := jsjson.TrimBOM(payload)
		if policyOK && jsjson.CheckText(text) == nil && encodingJSONAgrees(text) {
			key, keyHash, ok := oracleKey(t, text, template)
			require.Equal(t, ok, err == nil, "DeriveKey(%q, %q) = %v, but encoding/json resolves ok=%v", payload, template, err, ok)
			require.False(t, ok && (k.DisplayKey != key || k.KeyHash != keyHash), "DeriveKey(%q, %q) = %q %s, encoding/json oracle = %q %s", payload, template, k.DisplayKey, k.KeyHash, key, keyHash)
		}
		if err != nil {
			return
		}
		require.Regexp(t, lowerHex64, k.KeyHash, "KeyHash")
		require.Equal(t, "svc.job."+k.KeyHash, k.KVKey, "KVKey")
		require.Equal(t, kvKeyFor(k.Service, k.JobType, k.KeyHash), k.KVKey, "KVKey")
		require.Equal(t, "svc", k.Service)
		require.Equal(t, "job", k.JobType)
		parts := make([]string, len(template))
		for i, seg := range template {
			one, err := DeriveKey("svc", "job", payload, []string{seg})
			require.NoError(t, err, "segment %q alone", seg)
			parts[i] = one.DisplayKey
		}
		require.Equal(t, strings.Join(parts, ":"), k.DisplayKey, "Key is not the join of its segments")
		if !surrogateEscape.Match(payload) {
			require.True(t, utf8.ValidString(k.DisplayKey), "Key %q is not valid UTF-8 though the payload has no surrogate escapes", k.DisplayKey)
		}
	})
}
