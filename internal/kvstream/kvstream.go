package kvstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxReplicas is the most replicas a bucket [CheckStorage] accepts may
// have (JetStream's limit).
const MaxReplicas = 5

// CheckStorage returns an error naming the value when storage is not file
// or memory storage or replicas is not between 1 and [MaxReplicas]. The
// error is plain: each store wraps it in its own kind.
func CheckStorage(storage jetstream.StorageType, replicas int) error {
	if storage != jetstream.FileStorage && storage != jetstream.MemoryStorage {
		return fmt.Errorf("unknown storage type %d", storage)
	}
	if replicas < 1 || replicas > MaxReplicas {
		return fmt.Errorf("replicas %d is not between 1 and %d", replicas, MaxReplicas)
	}
	return nil
}

// Create creates the bucket cfg describes and returns it with created
// set. When another process created it first (jetstream.ErrBucketExists:
// with another configuration), it opens that bucket instead, created
// false. Other errors are js's, unwrapped.
func Create(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (kv jetstream.KeyValue, created bool, err error) {
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
		return kv, false, err
	}
	return kv, err == nil, err
}

// Features are the stream settings of a bucket that [Allow] turns on.
type Features struct {
	// AtomicPublish allows JetStream atomic batch publish (nats-server
	// 2.12 or later; an older server ignores the setting).
	AtomicPublish bool
	// MsgTTL allows per-message TTL (nats-server 2.11 or later).
	MsgTTL bool
}

// String names the features, as Allow's errors do.
func (f Features) String() string {
	var names []string
	if f.AtomicPublish {
		names = append(names, "atomic publish")
	}
	if f.MsgTTL {
		names = append(names, "per-message TTL")
	}
	if len(names) == 0 {
		return "nothing"
	}
	return strings.Join(names, " and ")
}

// Allow turns on the features f names on stream (its cached info says
// which are on) where they are off, with one stream update, and returns
// the stream's info as it is then: stream's cached info when nothing
// needed turning on. Any number of processes may do it at once. The
// error names the stream and the features.
func Allow(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, f Features) (*jetstream.StreamInfo, error) {
	info := stream.CachedInfo()
	if (!f.AtomicPublish || info.Config.AllowAtomicPublish) && (!f.MsgTTL || info.Config.AllowMsgTTL) {
		return info, nil
	}
	cfg := info.Config
	cfg.AllowAtomicPublish = cfg.AllowAtomicPublish || f.AtomicPublish
	cfg.AllowMsgTTL = cfg.AllowMsgTTL || f.MsgTTL
	updated, err := js.UpdateStream(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("allow %s on stream %q: %w", f, cfg.Name, err)
	}
	return updated.CachedInfo(), nil
}

// LastBySubjectRequest is the body of a STREAM.MSG.GET request for the
// last message of subject (wildcards allowed). A subject of printable
// ASCII without '"' or '\' (every KV key subject) is written by hand;
// any other goes through encoding/json.
func LastBySubjectRequest(subject string) ([]byte, error) {
	b, ok := AppendSubject(append(make([]byte, 0, 20+len(subject)), `{"last_by_subj":`...), subject)
	if !ok {
		return json.Marshal(map[string]string{"last_by_subj": subject})
	}
	return append(b, '}'), nil
}

// AppendSubject appends subject to b as a JSON string, written by hand,
// when it needs no escape (printable ASCII other than '"' and '\', as
// every subject of a KV bucket); ok is false, and b returned unchanged,
// for any other subject, which the caller leaves to encoding/json.
func AppendSubject(b []byte, subject string) (_ []byte, ok bool) {
	for i := 0; i < len(subject); i++ {
		if c := subject[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return b, false
		}
	}
	b = append(b, '"')
	b = append(b, subject...)
	return append(b, '"'), true
}

// Msg is the message a STREAM.MSG.GET answered with.
type Msg struct {
	Subject string
	Seq     uint64
	Time    time.Time // the server's stamp
	Hdrs    []byte    // the header block as stored; see [Deleted]
	Data    []byte
}

// msgGetReply is the JetStream API's answer to STREAM.MSG.GET.
type msgGetReply struct {
	Error *struct {
		Code        int    `json:"code"`
		ErrCode     int    `json:"err_code"`
		Description string `json:"description"`
	} `json:"error"`
	Message *struct {
		Subject string    `json:"subject"`
		Seq     uint64    `json:"seq"`
		Time    time.Time `json:"time"`
		Hdrs    []byte    `json:"hdrs"` // base64 in the JSON
		Data    []byte    `json:"data"` // base64 in the JSON
	} `json:"message"`
}

// ParseMsgGet reads the reply data of a STREAM.MSG.GET. found is false,
// with no error, when the stream has no such message (API error 10037).
// Any other API error is returned as a *jetstream.APIError; a reply that
// is not JSON fails with "bad response: …", one without a message with
// "response without a message". The errors are plain: each store wraps
// them, naming what it read.
func ParseMsgGet(data []byte) (m Msg, found bool, err error) {
	var r msgGetReply
	if err := json.Unmarshal(data, &r); err != nil {
		return Msg{}, false, fmt.Errorf("bad response: %w", err)
	}
	switch {
	case r.Error != nil && r.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return Msg{}, false, nil
	case r.Error != nil:
		return Msg{}, false, &jetstream.APIError{Code: r.Error.Code, ErrorCode: jetstream.ErrorCode(r.Error.ErrCode), Description: r.Error.Description}
	case r.Message == nil:
		return Msg{}, false, errors.New("response without a message")
	}
	return Msg{Subject: r.Message.Subject, Seq: r.Message.Seq, Time: r.Message.Time, Hdrs: r.Message.Hdrs, Data: r.Message.Data}, true, nil
}

// Deleted reports whether a message with header block hdrs (as
// [ParseMsgGet] returns it; empty: no headers) is a KV delete or purge
// marker. A block that cannot be decoded fails with "bad headers: …".
func Deleted(hdrs []byte) (bool, error) {
	if len(hdrs) == 0 {
		return false, nil
	}
	h, err := nats.DecodeHeadersMsg(hdrs)
	if err != nil {
		return false, fmt.Errorf("bad headers: %w", err)
	}
	return IsMarker(h), nil
}

// kvOperationHeader is the header of KV delete and purge markers.
const kvOperationHeader = "KV-Operation"

// IsMarker reports whether a message with headers h is a KV delete or
// purge marker, which readers treat as an absent key.
func IsMarker(h nats.Header) bool {
	op := h.Get(kvOperationHeader)
	return op == "DEL" || op == "PURGE"
}
