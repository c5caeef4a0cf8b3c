package natstest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the tests of the stores' own compare-and-swap writes compare with
// nats.go's KV layer: messages as the server stores them, written through
// JetStream contexts with and without a domain or API prefix.

// StoredMsg is one message of a stream as the server stores it.
type StoredMsg struct {
	Subject string `json:"subject"`
	Hdrs    []byte `json:"hdrs"` // the header block as stored, byte for byte
	Data    []byte `json:"data"`
}

// ReadStored reads message seq of stream over nc (STREAM.MSG.GET on the
// default API prefix), its headers as the raw block; it fails the test
// when the message cannot be read.
func ReadStored(t testing.TB, nc *nats.Conn, stream string, seq uint64) StoredMsg {
	t.Helper()
	req, err := json.Marshal(map[string]uint64{"seq": seq})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := nc.Request("$JS.API.STREAM.MSG.GET."+stream, req, 10*time.Second)
	if err != nil {
		t.Fatalf("read message %d of %s: %v", seq, stream, err)
	}
	var got struct {
		Error   *jetstream.APIError `json:"error"`
		Message *StoredMsg          `json:"message"`
	}
	if err := json.Unmarshal(resp.Data, &got); err != nil {
		t.Fatalf("read message %d of %s: %v", seq, stream, err)
	}
	if got.Error != nil || got.Message == nil {
		t.Fatalf("read message %d of %s: %v (%s)", seq, stream, got.Error, resp.Data)
	}
	return *got.Message
}

// JSContext is a JetStream context of a [RunDomain] server.
type JSContext struct {
	Name string
	JS   jetstream.JetStream
	// WritePrefix is what nats.go's KV layer puts in front of a bucket's
	// subjects ("$KV.<bucket>.<key>") when it writes through JS.
	WritePrefix string
}

// RunDomain starts a server with JetStream domain domain for the test and
// returns a connection to it with three JetStream contexts on it: Default
// (no domain, no prefix), Domain (the domain) and APIPrefix (the domain's
// API prefix, given as such).
func RunDomain(t testing.TB, domain string) (*nats.Conn, []JSContext) {
	t.Helper()
	s := RunWith(t, Options{Configure: func(o *server.Options) { o.JetStreamDomain = domain }})
	nc, plain := Connect(t, s)
	withDomain, err := jetstream.NewWithDomain(nc, domain)
	if err != nil {
		t.Fatal(err)
	}
	withPrefix, err := jetstream.NewWithAPIPrefix(nc, "$JS."+domain+".API")
	if err != nil {
		t.Fatal(err)
	}
	return nc, []JSContext{
		{"Default", plain, ""},
		{"Domain", withDomain, "$JS." + domain + ".API."},
		{"APIPrefix", withPrefix, "$JS." + domain + ".API."},
	}
}
