package jscas

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// TestAPIPrefixWithDomainAndAPIPrefix: when a JetStream context's options
// name both a domain and an API prefix, APIPrefix and WritePrefix give the
// prefix nats.go itself uses there (the one its constructor was given, as
// a trace of its own request shows), and a write sent under WritePrefix
// reaches the bucket as kv.Put's does.
func TestAPIPrefixWithDomainAndAPIPrefix(t *testing.T) {
	t.Parallel()
	nc, contexts := natstest.RunDomainAndPrefix(t, "hub")
	for _, tc := range contexts {
		t.Run(tc.Name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			api := tc.WritePrefix
			if api == "" {
				api = jetstream.DefaultAPIPrefix
			}
			opts := tc.JS.Options()
			assert.Equal(t, api, APIPrefix(opts), "API prefix of %+v", opts)
			bucket := "B_" + tc.Name
			require.Equal(t, tc.WritePrefix+"$KV."+bucket+".", WritePrefix(opts, bucket), "kv.Put's subjects")

			kv, err := tc.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, Storage: jetstream.MemoryStorage})
			require.NoError(t, err)
			rev, err := kv.Put(ctx, "k", []byte("v1"))
			require.NoError(t, err, "nats.go's own write")
			w := Writer{Conn: nc, Stream: "KV_" + bucket, Timeout: 10 * time.Second}
			rev2, err := w.Write(ctx, WritePrefix(opts, bucket)+"k", []byte("v2"), rev, false)
			require.NoError(t, err, "a write under WritePrefix")
			e, err := kv.Get(ctx, "k")
			require.NoError(t, err)
			assert.Equal(t, rev2, e.Revision())
			assert.Equal(t, "v2", string(e.Value()))
		})
	}
}
