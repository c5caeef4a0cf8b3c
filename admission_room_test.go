package jobkeys

// Room for the slot (docs/design/rules.md §4, item 8): a key filled by admissions up to
// the store's value size limit must still start every queued job (a slot
// encodes larger than a queue entry), and a limit lowered by an operator
// below a key's size must still let the key shrink.

import (
	"context"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roomBackend opens a store whose values may be at most limit bytes, and
// lowers that limit, returning a store that sees the new one.
type roomBackend struct {
	name  string
	open  func(t *testing.T, limit int) (Store, string)
	lower func(t *testing.T, st Store, svc string, limit int) Store
}

func roomBackends(t *testing.T) []roomBackend {
	n := startJKNATS(t)
	return []roomBackend{
		{
			name: "Memory",
			open: func(t *testing.T, limit int) (Store, string) {
				m := NewMemoryStore()
				require.NoError(t, m.SetMaxValueSize(limit))
				return m, jkService("room")
			},
			lower: func(t *testing.T, st Store, _ string, limit int) Store {
				require.NoError(t, st.(*MemoryStore).SetMaxValueSize(limit))
				return st
			},
		},
		{
			name: "NATS",
			open: func(t *testing.T, limit int) (Store, string) {
				svc := jkService("room")
				n.createBucket(t, svc, int32(limit+headerAllowance), 1)
				return n.store(t), svc
			},
			lower: func(t *testing.T, _ Store, svc string, limit int) Store {
				_, err := n.js.UpdateKeyValue(context.Background(), jetstream.KeyValueConfig{
					Bucket: BucketPrefixDefault + "_" + svc, History: 1, MaxValueSize: int32(limit + headerAllowance),
					Storage: jetstream.MemoryStorage, Replicas: 1,
				})
				require.NoError(t, err, "lower the bucket's value size limit")
				return n.store(t) // a store that has not cached the old limit
			},
		},
	}
}

// Admissions up to the limit leave room for every queued job to take a slot;
// after an operator lowers the limit below the key's size, a release and a
// removal that bring the state under it still succeed, and an admission
// does not.
func TestCoordinatorAdmissionLeavesRoomForSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, b := range roomBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			const limit = 8192
			st, svc := b.open(t, limit)
			c := cCoordinator(t, st, nil)
			key := cKey(t, svc)
			p := Policy{Key: cPolicy().Key, MaxActive: 1000}
			var ids []string
			var err error
			for i := range 1000 {
				id := fmt.Sprintf("job-%03d", i)
				var adm Admission
				if adm, err = c.Admit(ctx, cAdmit(svc, id, p)); err != nil {
					break
				}
				require.Equal(t, KindAccepted, adm.Kind)
				ids = append(ids, id)
			}
			require.ErrorIs(t, err, ErrStateTooLarge, "1000 admissions fit in %d bytes", limit)
			require.Greater(t, len(ids), 3)

			// Every admitted job can start; the last stays queued.
			var leases []Lease
			for _, id := range ids[:len(ids)-1] {
				acq, err := c.Acquire(ctx, cAcquire(svc, id, p, false))
				require.NoError(t, err, "acquire %s of %d admitted", id, len(ids))
				require.Equal(t, KindAcquired, acq.Kind)
				leases = append(leases, acq.Lease)
			}
			full, _ := stored(t, st, svc, key.KVKey)
			// It had room for the last one too.
			assert.LessOrEqual(t, len(full)+c.slotRoom, limit)

			// An operator lowers the limit below the key's size.
			st = b.lower(t, st, svc, len(full)-1)
			c = cCoordinator(t, st, nil)
			_, err = c.Admit(ctx, cAdmit(svc, "late", p))
			require.ErrorIs(t, err, ErrStateTooLarge, "admission over a lowered limit")
			rel, err := c.Release(ctx, ReleaseRequest{Lease: leases[0]})
			require.NoError(t, err, "a release that brings the state under the lowered limit")
			assert.Equal(t, KindReleased, rel.Kind)
			rem, err := c.RemoveQueued(ctx, RemoveRequest{Service: svc, JobType: cJobType, JobID: ids[len(ids)-1], Payload: cPayload, Policy: p})
			require.NoError(t, err, "a removal under the lowered limit")
			assert.Equal(t, KindRemoved, rem.Kind)
			s := storedState(t, st, svc, key.KVKey)
			assert.Len(t, s.Active, len(leases)-1)
			assert.Empty(t, s.Queued)
		})
	}
}
