package jobs

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"strconv"
	"sync"
	"time"
)

// ChannelDefault is the channel of an [EnqueueRequest] that names none, in
// [Client.Enqueue] and [Client.EnqueueMany].
const ChannelDefault = "default"

// IDLength is the length of an id [NewID] returns.
const IDLength = 26

// crockford is Crockford's base-32 alphabet: digits, then letters without
// I, L, O and U, in ASCII order, so that ids compare as strings as their
// numbers do.
const crockford = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

// idGen makes the ids of this process: the time of the last one and its
// 80 random bits, so that ids made in the same millisecond count up.
var idGen struct {
	mu     sync.Mutex
	ms     uint64
	hi     uint16 // the random bits' top 16
	lo     uint64 // and their low 64
	seeded bool
}

// NewID returns a new job id, unique and ordered by time: IDLength (26)
// characters of Crockford base 32 (0-9, A-Z without I, L, O, U) holding
// 48 bits of Unix milliseconds, then 80 bits drawn at random for each new
// millisecond and counted up by one for each further id of this process
// in the same millisecond — the layout of a ULID. Ids sort as strings by
// the time they were made; those of one process sort in the order they
// were made (should the clock step back, the process stays on the last
// millisecond it saw). Two processes in one millisecond draw 80 random
// bits each: they collide with negligible probability. It is safe for
// concurrent use. [Client.Enqueue] gives a request without an ID one.
func NewID() string {
	now := uint64(time.Now().UnixMilli()) & (1<<48 - 1)
	idGen.mu.Lock()
	switch {
	case !idGen.seeded || now > idGen.ms:
		var b [10]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
		idGen.ms, idGen.hi, idGen.lo = now, binary.BigEndian.Uint16(b[:2]), binary.BigEndian.Uint64(b[2:])
		idGen.seeded = true
	default: // the same millisecond, or the clock stepped back
		idGen.lo++
		if idGen.lo == 0 {
			idGen.hi++
			if idGen.hi == 0 { // 2^80 ids in one millisecond: the next one
				idGen.ms++
			}
		}
	}
	ms, hi, lo := idGen.ms, idGen.hi, idGen.lo
	idGen.mu.Unlock()
	return encodeID(ms, hi, lo)
}

// encodeID writes 48 bits of milliseconds (10 characters, the first
// holding 3 bits) and 80 random bits (16 characters) in Crockford base 32.
func encodeID(ms uint64, hi uint16, lo uint64) string {
	var out [IDLength]byte
	for i := 9; i >= 0; i-- {
		out[i] = crockford[ms&31]
		ms >>= 5
	}
	// 80 bits: hi (16) then lo (64), most significant first.
	for i := 25; i >= 10; i-- {
		out[i] = crockford[lo&31]
		lo = lo>>5 | uint64(hi&31)<<59
		hi >>= 5
	}
	return string(out[:])
}

// Fingerprint is the fingerprint [Client.Enqueue] gives a request without
// one: "sha256:" and the hex SHA-256 of the type, the version and the
// input, compacted (so that JSON differing only in spacing has one
// fingerprint; an empty input and JSON null are the same). A replay of an
// idempotency key with another type, version or input is then a conflict.
func Fingerprint(jobType string, version int, input json.RawMessage) string {
	h := sha256.New()
	h.Write([]byte(strconv.Quote(jobType)))
	h.Write([]byte{0})
	h.Write([]byte(strconv.Itoa(version)))
	h.Write([]byte{0})
	in := bytes.TrimSpace(input)
	var buf bytes.Buffer
	if json.Compact(&buf, in) == nil {
		in = buf.Bytes()
	}
	if !bytes.Equal(in, []byte("null")) {
		h.Write(in)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}
