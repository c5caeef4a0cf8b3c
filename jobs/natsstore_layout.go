package jobs

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// The KV layout of a NATSStore. Every record of a deployment lives in one
// bucket; a key is a record family, the channel's token and the record's
// own tokens:
//
//	job.<channel>.<job>                  the job record (JSON; the artifact inside once settled)
//	idem.<channel>.<idempotency key>     the job id and fingerprint an idempotency key enqueued
//	target.<channel>.<target key>        the target's generation and its newest job
//	list.<channel>.<created>.<job>       an empty entry per job: what List sorts and pages by
//	active.<channel>.<job>               an empty entry per pending, paused or running job
//
// <created> is the job's CreatedAt in Unix nanoseconds as 16 hex digits, so
// a List reads key names only and decodes values only for its page. The
// "active" family is the claim index: Claim reads only the jobs it names,
// never a completed one. An entry whose job has become terminal is stale; it
// is removed after the terminal write and, failing that, by the next Claim
// that meets it (self-healing), by a purge that cannot touch an entry
// written later. The list and active entries of an enqueue written key by
// key (natsstore_enqueue.go) precede its commit: an entry whose job record
// is staged and not committed is skipped, and kept.
//
// Channel ids, job ids, target keys and idempotency keys become tokens by
// escapeToken: letters, digits, '-' and '_' stay; every other byte becomes
// '=' and two uppercase hex digits. The escape is injective ('=' itself is
// escaped) and never yields '.', '*' or '>', so no two ids share a key and a
// channel's keys match "*.<channel>.>" and nothing else.
const (
	familyJob    = "job"
	familyIdem   = "idem"
	familyTarget = "target"
	familyList   = "list"
	familyActive = "active"
)

// escapeToken turns id into a KV key token; see the layout above. An empty id
// gives an empty token, which callers refuse before building a key.
func escapeToken(id string) string {
	if isPlainToken(id) {
		return id // nothing to escape: no copy
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(id))
	for i := 0; i < len(id); i++ {
		c := id[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('=')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&0x0f])
	}
	return b.String()
}

// unescapeToken reverses escapeToken; a token escapeToken cannot produce is
// an error.
func unescapeToken(tok string) (string, error) {
	if isPlainToken(tok) {
		return tok, nil // nothing escaped
	}
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_':
			b.WriteByte(c)
		case c == '=' && i+2 < len(tok) && isUpperHex(tok[i+1]) && isUpperHex(tok[i+2]):
			v, _ := strconv.ParseUint(tok[i+1:i+3], 16, 8)
			if isTokenByte(byte(v)) {
				return "", fmt.Errorf("token %q escapes %q, which is never escaped", tok, byte(v))
			}
			b.WriteByte(byte(v))
			i += 2
		default:
			return "", fmt.Errorf("token %q is not an escaped id (byte %d)", tok, i)
		}
	}
	return b.String(), nil
}

// isPlainToken reports whether every byte of s stays as it is in a token.
func isPlainToken(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isTokenByte(s[i]) {
			return false
		}
	}
	return true
}

func isTokenByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func isUpperHex(c byte) bool { return c >= '0' && c <= '9' || c >= 'A' && c <= 'F' }

// natsKeys builds the keys and subjects of one bucket.
type natsKeys struct {
	// prefix is "$KV.<bucket>.", the subject prefix of the bucket's keys.
	prefix string
}

func (k natsKeys) job(channelID, jobID string) string {
	return familyJob + "." + escapeToken(channelID) + "." + escapeToken(jobID)
}

func (k natsKeys) idem(channelID, idempotencyKey string) string {
	return familyIdem + "." + escapeToken(channelID) + "." + escapeToken(idempotencyKey)
}

func (k natsKeys) target(channelID, targetKey string) string {
	return familyTarget + "." + escapeToken(channelID) + "." + escapeToken(targetKey)
}

func (k natsKeys) list(channelID string, createdAt time.Time, jobID string) string {
	var created [16]byte
	hexNanos(created[:], uint64(createdAt.UnixNano()))
	return familyList + "." + escapeToken(channelID) + "." + string(created[:]) + "." + escapeToken(jobID)
}

func (k natsKeys) active(channelID, jobID string) string {
	return familyActive + "." + escapeToken(channelID) + "." + escapeToken(jobID)
}

// hexNanos writes v as len(dst) lowercase hex digits, zero-padded (as
// "%016x" for 16).
func hexNanos(dst []byte, v uint64) {
	const hex = "0123456789abcdef"
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = hex[v&0x0f]
		v >>= 4
	}
}

// subject is the stream subject of key.
func (k natsKeys) subject(key string) string { return k.prefix + key }

// key is the KV key of a stream subject of the bucket; ok is false for a
// subject outside it.
func (k natsKeys) key(subject string) (string, bool) {
	return strings.CutPrefix(subject, k.prefix)
}

// channelFilter matches every key of a channel, in every family.
func (k natsKeys) channelFilter(channelID string) string {
	return k.prefix + "*." + escapeToken(channelID) + ".>"
}

// activeFilter matches the active entries of a channel, or of every channel
// when channelID is empty.
func (k natsKeys) activeFilter(channelID string) string {
	if channelID == "" {
		return k.prefix + familyActive + ".>"
	}
	return k.prefix + familyActive + "." + escapeToken(channelID) + ".*"
}

// listFilter matches the list entries of a channel, or of every channel
// when channelID is empty.
func (k natsKeys) listFilter(channelID string) string {
	if channelID == "" {
		return k.prefix + familyList + ".>"
	}
	return k.prefix + familyList + "." + escapeToken(channelID) + ".*.*"
}

// splitKey splits key at its dots into parts, which it fills exactly: false
// when key has another number of tokens.
func splitKey(key string, parts []string) bool {
	for i := range parts[:len(parts)-1] {
		tok, rest, ok := strings.Cut(key, ".")
		if !ok {
			return false
		}
		parts[i], key = tok, rest
	}
	parts[len(parts)-1] = key
	return !strings.Contains(key, ".")
}

// parseActive returns the channel and job of an active entry's key.
func parseActive(key string) (channelID, jobID string, err error) {
	var parts [3]string
	if !splitKey(key, parts[:]) || parts[0] != familyActive {
		return "", "", fmt.Errorf("key %q is not an active entry", key)
	}
	if channelID, err = unescapeToken(parts[1]); err != nil {
		return "", "", err
	}
	if jobID, err = unescapeToken(parts[2]); err != nil {
		return "", "", err
	}
	return channelID, jobID, nil
}

// parseList returns the channel, creation time and job of a list entry's
// key.
func parseList(key string) (channelID string, createdAt time.Time, jobID string, err error) {
	var parts [4]string
	if !splitKey(key, parts[:]) || parts[0] != familyList || len(parts[2]) != 16 {
		return "", time.Time{}, "", fmt.Errorf("key %q is not a list entry", key)
	}
	nanos, err := strconv.ParseUint(parts[2], 16, 64)
	if err != nil {
		return "", time.Time{}, "", fmt.Errorf("key %q: creation time: %w", key, err)
	}
	if channelID, err = unescapeToken(parts[1]); err != nil {
		return "", time.Time{}, "", err
	}
	if jobID, err = unescapeToken(parts[3]); err != nil {
		return "", time.Time{}, "", err
	}
	return channelID, time.Unix(0, int64(nanos)).UTC(), jobID, nil
}
