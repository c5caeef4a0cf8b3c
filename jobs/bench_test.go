package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/jobkeys/jobkeys/internal/natstest"
)

// Benchmarks of NATSStore on an embedded server over TCP, each beside a raw
// KV baseline in the same run. Run them with
//
//	go test -run '^$' -bench 'JobCycle|Claim|ListPage' -benchtime 2000x ./jobs/
//
// and the memory soak with JOBKEYS_JOBS_SOAK=1 go test -run TestNATSStoreMemorySoak -v ./jobs/.

func benchStore(b *testing.B, s *server.Server, storage jetstream.StorageType) (*NATSStore, jetstream.JetStream) {
	b.Helper()
	_, js := natstest.Connect(b, s)
	bucket := fmt.Sprintf("JOBS_B%d", natsBucketSeq.Add(1))
	st, err := NewNATSStore(js, nil, WithBucket(bucket), WithCreateBucket(storage, 1))
	require.NoError(b, err)
	return st, js
}

func benchStorages() []struct {
	name    string
	storage jetstream.StorageType
} {
	return []struct {
		name    string
		storage jetstream.StorageType
	}{{"memory", jetstream.MemoryStorage}, {"file", jetstream.FileStorage}}
}

// BenchmarkJobCycle is enqueue → claim → settle, one job at a time, beside
// RawKV: three Get+Update round trips on one key, one per write of the
// cycle.
func BenchmarkJobCycle(b *testing.B) {
	s := natstest.Run(b)
	ctx := context.Background()
	for _, sc := range benchStorages() {
		b.Run("NATSStore/"+sc.name, func(b *testing.B) {
			st, _ := benchStore(b, s, sc.storage)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				id := strconv.Itoa(i)
				if _, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, id)); err != nil {
					b.Fatal(err)
				}
				got, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
				if err != nil || len(got) != 1 {
					b.Fatalf("claim: %v %d", err, len(got))
				}
				if _, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(got[0]), Artifact: json.RawMessage(`{"ok":true}`)}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("RawKV/"+sc.name, func(b *testing.B) {
			st, js := benchStore(b, s, sc.storage) // the same bucket configuration
			kv, err := js.KeyValue(ctx, st.Bucket())
			require.NoError(b, err)
			_, err = kv.Put(ctx, "k", []byte(`{"n":0}`))
			require.NoError(b, err)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for range 3 {
					e, err := kv.Get(ctx, "k")
					if err != nil {
						b.Fatal(err)
					}
					if _, err := kv.Update(ctx, "k", e.Value(), e.Revision()); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}

// seedCompleted writes n completed jobs (job, idempotency, target and list
// records, no active entry: what settles leave) into channel, directly and
// asynchronously, for the benchmarks that need a large channel.
func seedCompleted(b *testing.B, st *NATSStore, js jetstream.JetStream, channel string, n int) {
	b.Helper()
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for i := range n {
		id := fmt.Sprintf("done-%05d", i)
		created := now.Add(time.Duration(i) * time.Millisecond)
		j := Job{
			ID: id, ChannelID: channel, Type: "render", Version: 1, TargetKey: id, TargetGeneration: 1,
			IdempotencyKey: "idem-" + id, Fingerprint: "fp", Input: json.RawMessage(`{"n":1}`),
			State: StateCompleted, Attempts: 1, ClaimGeneration: 1,
			AvailableAt: created, CreatedAt: created, UpdatedAt: created,
		}
		value, err := encodeNATSJob(&j, &Artifact{JobID: id, Value: json.RawMessage(`{"ok":true}`), CreatedAt: created}, 0)
		require.NoError(b, err)
		target, _ := json.Marshal(natsTargetRecord{Generation: 1, JobID: id})
		idem, _ := json.Marshal(natsIdemRecord{JobID: id, Fingerprint: "fp"})
		for _, kv := range []struct {
			key   string
			value []byte
		}{
			{st.keys.target(channel, id), target}, {st.keys.idem(channel, j.IdempotencyKey), idem},
			{st.keys.list(channel, created, id), nil}, {st.keys.job(channel, id), value},
		} {
			if _, err := js.PublishAsync(st.keys.subject(kv.key), kv.value); err != nil {
				b.Fatal(err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("seeding did not complete in a minute")
	}
}

// BenchmarkClaim is the latency of a claim that finds one due job, in an
// empty channel and in one with 10,000 completed jobs; the enqueue and
// settle around it are not timed.
func BenchmarkClaim(b *testing.B) {
	s := natstest.Run(b)
	ctx := context.Background()
	for _, completed := range []int{0, 10000} {
		b.Run(fmt.Sprintf("completed=%d", completed), func(b *testing.B) {
			st, js := benchStore(b, s, jetstream.MemoryStorage)
			seedCompleted(b, st, js, "ch", completed)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				b.StopTimer()
				id := "new-" + strconv.Itoa(i)
				if _, err := st.Enqueue(ctx, testEnqueueRequest("ch", id, id)); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				got, err := st.Claim(ctx, ClaimRequest{ChannelID: "ch", Owner: "w", Count: 1, TTL: time.Minute})
				b.StopTimer()
				if err != nil || len(got) != 1 {
					b.Fatalf("claim: %v %d", err, len(got))
				}
				if _, err := st.Settle(ctx, SettleRequest{Claim: ClaimOf(got[0])}); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkListPage reads a 20-job page of a channel of 10,000 jobs: the
// first page and one from the middle (by cursor) with the store's kept
// listing, the first page without it (cold), beside RawKV: 20 Gets, the
// values of the page alone.
func BenchmarkListPage(b *testing.B) {
	s := natstest.Run(b)
	ctx := context.Background()
	st, js := benchStore(b, s, jetstream.MemoryStorage)
	seedCompleted(b, st, js, "ch", 10000)
	mid := &Cursor{CreatedAt: time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC), ID: "done-05000"}
	for _, bc := range []struct {
		name  string
		after *Cursor
		cold  bool
	}{{"first", nil, false}, {"middle", mid, false}, {"first-cold", nil, true}} {
		b.Run("NATSStore/"+bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.cold { // the listing as a store that has not listed the channel reads it
					st.lists.clear()
				}
				page, err := st.List(ctx, ListRequest{ChannelID: "ch", Limit: 20, After: bc.after})
				if err != nil || len(page.Jobs) != 20 {
					b.Fatalf("list: %v %d", err, len(page.Jobs))
				}
			}
		})
	}
	b.Run("RawKV/20-gets", func(b *testing.B) {
		kv, err := js.KeyValue(ctx, st.Bucket())
		require.NoError(b, err)
		b.ReportAllocs()
		for b.Loop() {
			for i := range 20 {
				if _, err := kv.Get(ctx, st.keys.job("ch", fmt.Sprintf("done-%05d", 9999-i))); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// TestNATSStoreMemorySoak runs 100,000 job cycles (JOBKEYS_JOBS_SOAK=1)
// and logs the heap every 10,000: the store keeps no state, so it stays
// flat. Each channel of 1,000 jobs is deleted once done, so the embedded
// server's own data stays bounded too.
func TestNATSStoreMemorySoak(t *testing.T) {
	if os.Getenv("JOBKEYS_JOBS_SOAK") == "" {
		t.Skip("set JOBKEYS_JOBS_SOAK=1 to run 100,000 job cycles")
	}
	s := natstest.Run(t)
	st, _ := newTestNATSStore(t, s, nil)
	ctx := context.Background()
	const cycles, every = 100000, 10000
	var heaps []uint64
	for i := range cycles {
		ch := "ch-" + strconv.Itoa(i/1000)
		id := strconv.Itoa(i)
		_, err := st.Enqueue(ctx, testEnqueueRequest(ch, id, id))
		require.NoError(t, err)
		got, err := st.Claim(ctx, ClaimRequest{ChannelID: ch, Owner: "w", Count: 1, TTL: time.Minute})
		require.NoError(t, err)
		require.Len(t, got, 1)
		_, err = st.Settle(ctx, SettleRequest{Claim: ClaimOf(got[0])})
		require.NoError(t, err)
		if i%1000 == 999 {
			require.NoError(t, st.DeleteChannel(ctx, ch))
		}
		if (i+1)%every == 0 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			heaps = append(heaps, ms.HeapInuse)
			t.Logf("after %6d cycles: heap in use %6.1f MiB, goroutines %d", i+1, float64(ms.HeapInuse)/(1<<20), runtime.NumGoroutine())
		}
	}
	require.Less(t, heaps[len(heaps)-1], 2*heaps[0], "the heap doubled between %d and %d cycles", every, cycles)
}

// BenchmarkNATSRecordCodec is the encoding and decoding of one running
// job's record (the claim's write), by the store's codec and by
// encoding/json, which defines the format.
func BenchmarkNATSRecordCodec(b *testing.B) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 891011, time.UTC)
	j := Job{
		ID: "job-12345", ChannelID: "ch", Type: "render", Version: 1, Origin: "user", TargetKey: "doc-12345",
		TargetGeneration: 1, IdempotencyKey: "idem-12345", Fingerprint: "fp-12345", Input: json.RawMessage(`{"n":1}`),
		State: StateRunning, Attempts: 1, ClaimGeneration: 1, ClaimOwner: "w", ClaimExpiresAt: now.Add(time.Minute),
		AvailableAt: now, CreatedAt: now, UpdatedAt: now,
	}
	data, err := encodeNATSJobMeta(&j, nil, natsMeta{activeSeq: 41})
	require.NoError(b, err)
	r, err := unmarshalNATSRecord(data)
	require.NoError(b, err)
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := encodeNATSJobMeta(&j, nil, natsMeta{activeSeq: 41}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(&r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, _, _, err := decodeNATSJobMeta("job.ch.job-12345", 42, data, "ch", "job-12345"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := unmarshalNATSRecord(data); err != nil {
				b.Fatal(err)
			}
		}
	})
}
