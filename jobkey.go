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

	// Key is the display key: the template's segments joined with ":", each
	// literal as written and each pointer's value as JavaScript's String(v)
	// prints it. Different templates and payloads can give the same Key (a
	// segment may contain ":", and "42" prints as the number 42 does), so it
	// is for people, not for identity. It is valid UTF-8 unless a payload
	// string held a lone surrogate escape such as "\ud800": JavaScript keeps
	// that, and so does Key, encoded as WTF-8 (three bytes ED A0 80).
	Key string

	// KeyHash is the lowercase hex SHA-256 of the bytes JavaScript's
	// JSON.stringify({version: 1, segments}) writes for the key's segments,
	// each a string, a number or a boolean. It identifies the key.
	KeyHash string

	// KVKey is the key of the key's state in the bucket:
	// <Service>.<JobType>.<KeyHash>.
	KVKey string
}

// DeriveKey derives the job key of a payload under a key template, exactly
// as the TS original's deriveJobKey does, so that Go and TS workers sharing a
// bucket agree on every key.
//
// service must be non-empty and use only A-Z, a-z, 0-9, '_' and '-'; jobType
// must be non-empty and use only those and '=' and '/'. Otherwise the error
// wraps [ErrInvalidName]; names are checked before anything else.
//
// Each template segment that starts with "/" is an RFC 6901 JSON pointer into
// the payload and must resolve to a string, a finite number or a boolean;
// any other segment is a literal string. A pointer that resolves to nothing,
// to null, an object, an array or a non-finite number is an error wrapping
// [ErrInvalidKey] that names the pointer. A template segment that is not
// valid UTF-8, or a pointer with a "~" not followed by "0" or "1", is an
// error wrapping [ErrInvalidPolicy]; the template is checked after the names
// and before the payload. (The TS original reads such a "~" literally;
// [Policy.Normalize] refuses it too.)
//
// payload is JSON text if it is a []byte or a [json.RawMessage], read as
// JavaScript reads a message body with JSON.parse(new
// TextDecoder().decode(bytes)): a leading byte order mark is dropped,
// numbers are IEEE doubles (so
// 12345678901234567890 is 12345678901234567000 and 1e400 is Infinity, which
// no pointer may resolve to), lone surrogate escapes are kept, and invalid
// UTF-8 in strings reads as U+FFFD. Any other payload, a string included, is
// encoded with [encoding/json.Marshal] first. A payload that is not valid
// JSON, or cannot be marshalled, is an error wrapping [ErrInvalidKey]; it is
// checked even when the template has no pointers.
//
// DeriveKey is safe for concurrent use. It takes one SHA-256 over a buffer
// and, for a []byte payload, allocates only the strings it returns.
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
	if err := checkJSONText(text); err != nil {
		return JobKey{}, fmt.Errorf("%w: payload is not valid JSON: %w", ErrInvalidKey, err)
	}

	var keyBuf [128]byte
	var hashBuf [256]byte
	var scratchBuf [64]byte
	key := keyBuf[:0]
	hashed := append(hashBuf[:0], `{"version":1,"segments":[`...)
	scratch := scratchBuf[:0]
	for i, seg := range template {
		if i > 0 {
			key = append(key, ':')
			hashed = append(hashed, ',')
		}
		if seg == "" || seg[0] != '/' {
			key = append(key, seg...)
			hashed = appendJSString(hashed, seg)
			continue
		}
		pos, ok, s := resolveText(text, seg, scratch)
		scratch = s
		if !ok {
			return JobKey{}, keySegmentError(seg, "nothing")
		}
		switch c := text[pos]; {
		case c == '"':
			start := len(key)
			key = appendStringValue(key, text[pos+1:stringEnd(text, pos)-1])
			hashed = appendJSQuoted(hashed, key[start:])
		case c == '-' || (c >= '0' && c <= '9'):
			lit := text[pos:valueEnd(text, pos)]
			// A range error still gives the value JavaScript reads: ±Inf
			// above the largest double, 0 or a subnormal below the smallest.
			f, _ := strconv.ParseFloat(string(lit), 64)
			if math.IsInf(f, 0) {
				return JobKey{}, keySegmentError(seg, "a non-finite number ("+string(lit)+")")
			}
			start := len(key)
			key = appendJSNumber(key, f)
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
		Service: service,
		JobType: jobType,
		Key:     string(key),
		KeyHash: kvKey[len(kvKey)-2*len(sum):],
		KVKey:   kvKey,
	}, nil
}

// keySegmentError reports a pointer that did not resolve to a key segment;
// got says what it resolved to.
func keySegmentError(pointer, got string) error {
	return fmt.Errorf("%w: key pointer %q did not resolve to a string, finite number or boolean (it resolved to %s)",
		ErrInvalidKey, pointer, got)
}

// payloadText returns the JSON text of a DeriveKey payload.
func payloadText(payload any) ([]byte, error) {
	switch p := payload.(type) {
	case []byte:
		return trimBOM(p), nil
	case json.RawMessage:
		return trimBOM(p), nil
	}
	text, err := json.Marshal(payload)
	if err != nil {
		return nil, fmt.Errorf("%w: payload cannot be encoded as JSON: %w", ErrInvalidKey, err)
	}
	return text, nil
}

// validateService reports whether service can name a bucket
// (JOBS_KEYS_<service>) and be the first token of a KV key: it must be
// non-empty and use only A-Z, a-z, 0-9, '_' and '-'. The error wraps
// [ErrInvalidName].
func validateService(service string) error {
	return validateName("service", service, false)
}

// validateJobType reports whether jobType can be one token of a KV key: it
// must be non-empty and use only A-Z, a-z, 0-9, '_', '-', '=' and '/' (no
// '.', which separates tokens, and no wildcards or spaces). The error wraps
// [ErrInvalidName].
func validateJobType(jobType string) error {
	return validateName("job type", jobType, true)
}

func validateName(what, name string, jobType bool) error {
	if name == "" {
		return fmt.Errorf("%w: %s is empty", ErrInvalidName, what)
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
