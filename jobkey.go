package jobkeys

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jobkeys/jobkeys/internal/jsjson"
)

// JobKey identifies the key a job is admitted under: the KV key its state
// lives at and the display key written into that state. It is what
// [DeriveKey] returns; the zero value identifies nothing. A JobKey is a plain
// value, safe to copy and to share between goroutines.
type JobKey struct {
	// Service is the service the job belongs to; its bucket is
	// JOBS_KEYS_<Service>.
	Service string

	// JobType is the type of the job, the second token of KVKey.
	JobType string

	// DisplayKey is the display key: the template's segments joined with ":", each
	// literal as written and each pointer's value as JavaScript's String(v)
	// prints it. Different templates and payloads can give the same DisplayKey (a
	// segment may contain ":", and "42" prints as the number 42 does), so it
	// is for people, not for identity. It is valid UTF-8 unless a payload
	// string held a lone surrogate escape such as "\ud800": JavaScript keeps
	// that, and so does DisplayKey, encoded as WTF-8 (three bytes ED A0 80).
	DisplayKey string

	// KeyHash is the lowercase hex SHA-256 of the bytes JavaScript's
	// JSON.stringify({version: 1, segments}) writes for the key's segments,
	// each a string, a number or a boolean. It identifies the key.
	KeyHash string

	// KVKey is the key of the key's state in the bucket:
	// <Service>.<JobType>.<KeyHash>.
	KVKey string
}

// MaxPayloadDepth is the deepest nesting of arrays and objects a payload may
// have: [DeriveKey] refuses a deeper payload, JSON text or Go value, with an
// error wrapping [ErrInvalidKey]. It bounds the stack encoding/json and the
// key derivation use; encoding/json itself refuses JSON text nested deeper.
const MaxPayloadDepth = 10000

// The key derivation and the state decoder enforce the limit through
// internal/jsjson: these arrays have a negative length, which does not
// compile, unless MaxPayloadDepth is jsjson.MaxDepth.
var (
	_ [MaxPayloadDepth - jsjson.MaxDepth]struct{}
	_ [jsjson.MaxDepth - MaxPayloadDepth]struct{}
)

// DeriveKey derives the job key of a payload under a key template: the
// display key, the key hash and the KV key its state lives at. Workers in
// other languages that share the bucket (the TypeScript original) derive the
// same key from the same payload and template, byte for byte.
//
// service must be 1 to [MaxServiceLength] bytes of A-Z, a-z, 0-9, '_' and
// '-'; jobType must be 1 to [MaxJobTypeLength] bytes of those and '=' and
// '/'. Otherwise the error wraps [ErrInvalidName]; names are checked before
// anything else.
//
// Each template segment that starts with "/" is an RFC 6901 JSON pointer into
// the payload and must resolve to a string, a finite number or a boolean;
// any other segment is a literal string. A pointer that resolves to nothing,
// to null, an object, an array or a non-finite number is an error wrapping
// [ErrInvalidKey] that names the pointer. A template segment that is not
// valid UTF-8, or a pointer with a "~" not followed by "0" or "1", is an
// error wrapping [ErrInvalidPolicy]; the template is checked after the names
// and before the payload. ([Policy.Normalize] refuses such a "~" too.)
//
// payload is JSON text if it is a []byte or a [json.RawMessage], read as a
// JavaScript worker reads a message body: a leading byte order mark is
// dropped, numbers are IEEE doubles (so 12345678901234567890 is
// 12345678901234567000 and 1e400 is Infinity, which no pointer may resolve
// to), a lone surrogate escape such as "\ud800" is kept (see
// [JobKey.Key]), invalid UTF-8 in strings reads as U+FFFD, and with
// duplicate member names the last one counts. Any other payload, a string
// included, is encoded with [encoding/json.Marshal] first. A payload that is
// not valid JSON, cannot be marshalled, or nests arrays and objects deeper
// than [MaxPayloadDepth] is an error wrapping [ErrInvalidKey]; it is checked
// even when the template has no pointers.
//
// DeriveKey is safe for concurrent use. Its cost is linear in the size of
// the payload; for a []byte payload it allocates only the strings it
// returns.
func DeriveKey(service, jobType string, payload any, template []string) (JobKey, error) {
	if err := validateService(service); err != nil {
		return JobKey{}, err
	}
	if err := validateJobType(jobType); err != nil {
		return JobKey{}, err
	}
	for i, seg := range template {
		if !utf8.ValidString(seg) {
			return JobKey{}, fmt.Errorf("%w: key template segment %d (%q) is not valid UTF-8", ErrInvalidPolicy, i, seg)
		}
		if seg != "" && seg[0] == '/' {
			if err := checkPointer(seg); err != nil {
				return JobKey{}, err
			}
		}
	}
	return deriveKey(service, jobType, payload, template)
}

// deriveKey is DeriveKey for names and a template that were checked
// already ([JobType] checks them once).
func deriveKey(service, jobType string, payload any, template []string) (JobKey, error) {
	text, err := payloadText(payload)
	if err != nil {
		return JobKey{}, err
	}
	if err := jsjson.CheckText(text); err != nil {
		return JobKey{}, fmt.Errorf("%w: payload is not valid JSON: %w", ErrInvalidKey, err)
	}

	var keyBuf [128]byte
	var hashBuf [256]byte
	key := keyBuf[:0]
	hashed := append(hashBuf[:0], `{"version":1,"segments":[`...)
	for i, seg := range template {
		if i > 0 {
			key = append(key, ':')
			hashed = append(hashed, ',')
		}
		if seg == "" || seg[0] != '/' {
			key = append(key, seg...)
			hashed = jsjson.AppendString(hashed, seg)
			continue
		}
		pos, ok := jsjson.Resolve(text, seg)
		if !ok {
			if s, isString := payload.(string); isString {
				// The commonest mistake: JSON text in a Go string.
				return JobKey{}, fmt.Errorf("%w: key pointer %q resolved to nothing: the payload is a Go string, which is the JSON string %s, not an object (pass JSON text as []byte or json.RawMessage)",
					ErrInvalidKey, seg, abbrev(strconv.Quote(s), 64))
			}
			return JobKey{}, keySegmentError(seg, "nothing")
		}
		switch c := text[pos]; {
		case c == '"':
			start := len(key)
			key = jsjson.AppendStringValue(key, text[pos+1:jsjson.StringEnd(text, pos)-1])
			hashed = jsjson.AppendStringBytes(hashed, key[start:])
		case c == '-' || (c >= '0' && c <= '9'):
			lit := text[pos:jsjson.ValueEnd(text, pos)]
			// A range error still gives the value JavaScript reads: ±Inf
			// above the largest double, 0 or a subnormal below the smallest.
			f, _ := strconv.ParseFloat(string(lit), 64)
			if math.IsInf(f, 0) {
				return JobKey{}, keySegmentError(seg, "a non-finite number ("+string(lit)+")")
			}
			start := len(key)
			key = jsjson.AppendNumber(key, f)
			hashed = append(hashed, key[start:]...)
		case c == 't':
			key = append(key, "true"...)
			hashed = append(hashed, "true"...)
		case c == 'f':
			key = append(key, "false"...)
			hashed = append(hashed, "false"...)
		case c == 'n':
			return JobKey{}, keySegmentError(seg, "null")
		case c == '{':
			return JobKey{}, keySegmentError(seg, "an object")
		default:
			return JobKey{}, keySegmentError(seg, "an array")
		}
	}
	hashed = append(hashed, "]}"...)
	sum := sha256.Sum256(hashed)

	var kv strings.Builder
	kv.Grow(len(service) + len(jobType) + 2 + 2*len(sum))
	kv.WriteString(service)
	kv.WriteByte('.')
	kv.WriteString(jobType)
	kv.WriteByte('.')
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], sum[:])
	kv.Write(hexSum[:])
	kvKey := kv.String()
	return JobKey{
		Service:    service,
		JobType:    jobType,
		DisplayKey: string(key),
		KeyHash:    kvKey[len(kvKey)-2*len(sum):],
		KVKey:      kvKey,
	}, nil
}

// checkPointer reports whether pointer is a well-formed key pointer (see
// [jsjson.CheckPointer]). The error wraps [ErrInvalidPolicy] and names the
// pointer.
func checkPointer(pointer string) error {
	if err := jsjson.CheckPointer(pointer); err != nil {
		return fmt.Errorf("%w: key %w", ErrInvalidPolicy, err)
	}
	return nil
}

// keySegmentError reports a pointer that did not resolve to a key segment;
// got says what it resolved to.
func keySegmentError(pointer, got string) error {
	return fmt.Errorf("%w: key pointer %q did not resolve to a string, finite number or boolean (it resolved to %s)",
		ErrInvalidKey, pointer, got)
}

// abbrev returns s, or its first n bytes (fewer, to end on a character
// boundary) and "…" when it is longer.
func abbrev(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// payloadText returns the JSON text of a DeriveKey payload.
func payloadText(payload any) ([]byte, error) {
	switch p := payload.(type) {
	case []byte:
		return jsjson.TrimBOM(p), nil
	case json.RawMessage:
		return jsjson.TrimBOM(p), nil
	}
	if err := jsjson.CheckValueDepth(payload); err != nil {
		return nil, fmt.Errorf("%w: payload cannot be encoded as JSON: %w", ErrInvalidKey, err)
	}
	text, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload cannot be encoded as JSON: %w", ErrInvalidKey, err)
	}
	return text, nil
}

// Name length limits. A NATS server closes a connection whose protocol line
// is longer than its control-line limit (4096 bytes by default), which would
// cut off every coordinator, heartbeat and watcher sharing it; these limits
// keep every request the stores send below it with room to spare.
//
// The longest line is the one that creates the consumer watching one key,
// service S (s bytes) and job type J (j bytes), bucket JOBS_KEYS_S:
//
//	HPUB $JS.API.CONSUMER.CREATE.KV_JOBS_KEYS_S.<consumer>.$KV.JOBS_KEYS_S.S.J.<64 hex> <reply> <hlen> <len>\r\n
//
// with a consumer name of at most 43 bytes (a NUID, "_", a serial), the
// reply inbox "_INBOX.<22>.<8>" (38 bytes) and two lengths of at most 10
// digits: 231 + 3s + j bytes. (A key's direct get,
// $JS.API.DIRECT.GET.KV_JOBS_KEYS_S.$KV.JOBS_KEYS_S.S.J.<64 hex>, and a
// write to $KV.JOBS_KEYS_S.S.J.<64 hex> are shorter.) At the limits below
// that is 231 + 384 + 1024 = 1639 bytes, which leaves about 2.4 KiB for a
// JetStream API prefix or domain, a custom inbox prefix
// (nats.CustomInboxPrefix) and a longer bucket prefix. The stream name
// KV_JOBS_KEYS_S must also stay within JetStream's 255 bytes: 13 + s.
const (
	// MaxServiceLength is the longest service name, in bytes.
	MaxServiceLength = 128
	// MaxJobTypeLength is the longest job type, in bytes.
	MaxJobTypeLength = 1024
)

// validateService reports whether service can name a bucket
// (JOBS_KEYS_<service>) and be the first token of a KV key: it must be
// 1 to MaxServiceLength bytes of A-Z, a-z, 0-9, '_' and '-'. The error wraps
// [ErrInvalidName].
func validateService(service string) error {
	return validateName("service", service, MaxServiceLength, false)
}

// validateJobType reports whether jobType can be one token of a KV key: it
// must be 1 to MaxJobTypeLength bytes of A-Z, a-z, 0-9, '_', '-', '=' and
// '/' (no '.', which separates tokens, and no wildcards or spaces). The
// error wraps [ErrInvalidName].
func validateJobType(jobType string) error {
	return validateName("job type", jobType, MaxJobTypeLength, true)
}

func validateName(what, name string, maxLen int, jobType bool) error {
	if name == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalidName, what)
	}
	if len(name) > maxLen {
		return fmt.Errorf("%w: %s %.32q... is %d bytes long, more than the %d allowed", ErrInvalidName, what, name, len(name), maxLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' ||
			jobType && (c == '=' || c == '/') {
			continue
		}
		allowed := "A-Z, a-z, 0-9, '_' and '-'"
		if jobType {
			allowed = "A-Z, a-z, 0-9, '_', '-', '=' and '/'"
		}
		r, _ := utf8.DecodeRuneInString(name[i:])
		return fmt.Errorf("%w: %s %q: character %q at byte %d is not allowed (use only %s)",
			ErrInvalidName, what, name, r, i, allowed)
	}
	return nil
}

// kvKeyFor returns the KV key of a key's state: <service>.<jobType>.<keyHash>.
func kvKeyFor(service, jobType, keyHash string) string {
	return service + "." + jobType + "." + keyHash
}
