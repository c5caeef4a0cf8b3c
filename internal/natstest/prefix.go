package natstest

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// What the tests of the stores' API subjects compare with: JetStream
// contexts whose options name both a domain and an API prefix. nats.go
// sets only one of them itself (jetstream.NewWithDomain sets Domain,
// jetstream.NewWithAPIPrefix sets APIPrefix); any JetStreamOpt can set the
// other, and nats.go then obeys the one its constructor was given.

// RunDomainAndPrefix starts a server with JetStream domain domain for the
// test and returns a connection to it with two JetStream contexts whose
// options name both a domain and an API prefix: "DomainFirst", made by
// jetstream.NewWithDomain(domain) with an option that sets APIPrefix to
// another domain's, and "APIPrefixFirst", made by
// jetstream.NewWithAPIPrefix("$JS.<domain>.API") with an option that sets
// Domain to another domain. In both, the subjects nats.go uses are the
// server's domain's, and those the other field names reach no stream.
// Each context's WritePrefix is the API prefix nats.go's own requests
// used there, as a ClientTrace saw the subject of an account info request
// ("" for the default "$JS.API.", as kv.Update writes then): a value
// observed, not assumed.
func RunDomainAndPrefix(t testing.TB, domain string) (*nats.Conn, []JSContext) {
	t.Helper()
	s := RunWith(t, Options{Configure: func(o *server.Options) { o.JetStreamDomain = domain }})
	nc, _ := Connect(t, s)
	const other = "elsewhere"
	setAPIPrefix := func(o *jetstream.JetStreamOptions) error { o.APIPrefix = "$JS." + other + ".API"; return nil }
	setDomain := func(o *jetstream.JetStreamOptions) error { o.Domain = other; return nil }
	out := make([]JSContext, 0, 2)
	for _, c := range []struct {
		name string
		make func(trace jetstream.JetStreamOpt) (jetstream.JetStream, error)
	}{
		{"DomainFirst", func(trace jetstream.JetStreamOpt) (jetstream.JetStream, error) {
			return jetstream.NewWithDomain(nc, domain, setAPIPrefix, trace)
		}},
		{"APIPrefixFirst", func(trace jetstream.JetStreamOpt) (jetstream.JetStream, error) {
			return jetstream.NewWithAPIPrefix(nc, "$JS."+domain+".API", setDomain, trace)
		}},
	} {
		var (
			mu   sync.Mutex
			sent []string
		)
		traced, err := c.make(jetstream.WithClientTrace(&jetstream.ClientTrace{RequestSent: func(subj string, _ []byte) {
			mu.Lock()
			sent = append(sent, subj)
			mu.Unlock()
		}}))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err = traced.AccountInfo(ctx)
		cancel()
		if err != nil {
			t.Fatalf("%s: account info through nats.go's own prefix: %v", c.name, err)
		}
		mu.Lock()
		subjects := append([]string(nil), sent...)
		mu.Unlock()
		if len(subjects) != 1 || !strings.HasSuffix(subjects[0], "INFO") {
			t.Fatalf("%s: account info sent as %q; one request to <prefix>INFO expected", c.name, subjects)
		}
		used := strings.TrimSuffix(subjects[0], "INFO")
		if used == jetstream.DefaultAPIPrefix {
			used = ""
		}
		js, err := c.make(func(*jetstream.JetStreamOptions) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		if o := js.Options(); o.Domain == "" || o.APIPrefix == "" {
			t.Fatalf("%s: options %+v name a domain and an API prefix both", c.name, o)
		}
		out = append(out, JSContext{Name: c.name, JS: js, WritePrefix: used})
	}
	return nc, out
}
