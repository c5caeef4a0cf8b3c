package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobkeys/jobkeys/internal/boundedmap"
	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/jobkeys/jobkeys/internal/kvstream"
	"github.com/jobkeys/jobkeys/internal/wake"
	"github.com/nats-io/nats.go/jetstream"
)

// BucketPrefixDefault is the prefix of the bucket names NATSStore uses: the
// bucket of service S is "JOBS_KEYS_S", shared with workers in other
// languages that use the same wire format.
const BucketPrefixDefault = "JOBS_KEYS"

// headerAllowance is kept free of a message's size limit for the headers a
// compare-and-swap write carries.
const headerAllowance = 256

// NATSStore is a [Store] over NATS JetStream KV: service S lives in bucket
// "JOBS_KEYS_S" (stream "KV_JOBS_KEYS_S"). Buckets are opened on first use
// and cached. It also implements [WatchableStore] and [ListableStore]. A NATSStore
// is safe for concurrent use; create it with [NewNATSStore].
//
// On a replicated bucket, Get reads through the stream leader
// (STREAM.MSG.GET, under the JetStream context's API prefix or domain), so
// that a decision never rests on a replica that lags behind.
//
// # Permissions
//
// A worker of service S that does not create buckets needs, with the
// default API prefix, permission to publish to
//
//	$KV.JOBS_KEYS_S.>                             writes and deletes
//	$JS.API.STREAM.INFO.KV_JOBS_KEYS_S            opening the bucket
//	$JS.API.DIRECT.GET.KV_JOBS_KEYS_S.>           reads (R1 buckets)
//	$JS.API.STREAM.MSG.GET.KV_JOBS_KEYS_S         reads (replicated buckets)
//	$JS.API.CONSUMER.CREATE.KV_JOBS_KEYS_S.>      watches and key listings
//	$JS.API.CONSUMER.DELETE.KV_JOBS_KEYS_S.>      ending them
//	$JS.FC.KV_JOBS_KEYS_S.>                       flow control of watches
//
// and to subscribe to its inboxes (_INBOX.> by default), where request
// replies and watch deliveries arrive. Under a JetStream domain or API
// prefix P ("$JS.<domain>.API" for a domain) the "$JS.API" subjects start
// with P instead, and writes go to P.$KV.JOBS_KEYS_S.>.
// [WithCreateBuckets] needs $JS.API.STREAM.CREATE.KV_JOBS_KEYS_S too, and
// $JS.API.STREAM.UPDATE.KV_JOBS_KEYS_S to allow atomic publish on the
// buckets it creates (without it they work, one write per state).
// [WithWakeUps] needs publish and subscribe on "<prefix>.JOBS_KEYS_S.>"
// ("jobkeys.wake.JOBS_KEYS_S.>" by default).
// Where users share a server, "_INBOX.>" lets any of them read the others'
// replies: give each user its own prefix with [nats.CustomInboxPrefix] and
// allow only that prefix.
//
// The server refuses a publish or subscription outside the permissions by
// reporting it to the connection's async error handler; the refused request
// itself would only time out. The first NewNATSStore on a connection
// therefore puts a handler in front of the connection's (the handler it
// finds is still called, with every error; the stores on the connection
// share the one), and a call that needs a refused subject fails at once with
// an error wrapping [ErrPermission] that names the subject. A refusal of one
// of the bucket's subjects fails every call in flight that needs it. A
// handler set on the connection after NewNATSStore replaces the store's;
// refused calls then time out.
//
// # Atomic batches
//
// When a coordinator's operations on one key queue behind each other, the
// states they write may go to the bucket as one JetStream atomic batch
// (one message per state, each a revision of its own, all or nothing, in
// one round trip). The store does so only where the bucket's stream allows
// atomic publish (nats-server 2.12 or later; [WithCreateBuckets] allows it
// on the buckets it creates) and a batch costs about one write: on memory
// storage and on replicated file storage, not on R1 file storage, where
// the server stages each batch in a temporary file store. It reads which
// from the stream's configuration when it opens the bucket. The messages
// are those single writes would store, with the batch headers
// (Nats-Batch-Id, Nats-Batch-Sequence, Nats-Batch-Commit) added, and the
// revision condition on the first only. The store decides once per bucket
// it opens, so before moving a bucket to servers older than 2.12 (which
// would take a batch's messages one by one, the later ones without a
// condition), turn AllowAtomicPublish off on its stream and restart the
// processes that use it.
//
// # Clocks
//
// The store keeps, per bucket, bounds on the offset between this host's
// clock and the clock of the server that stamps the bucket's messages,
// from the server times it sees: the stream info it reads when it opens
// the bucket, the stamps of the values Get reads and of the changes its
// watches deliver, and a stream info request when its bounds are ten
// seconds old (made by the acquisition or sweep that finds them so). A
// [KeyCoordinator] over it refuses acquisitions and sweeps while its clock
// is proven too far from the server's (see [ErrClockSkew]).
//
// # Durability
//
// A file-storage bucket is only as durable as the server's fsync: by
// default nats-server syncs every two minutes, and Jepsen's analysis of NATS
// 2.12.1 found that a crash of the machine (not just of the process) can
// then lose acknowledged writes, even on R3 buckets when the nodes fail
// together. A lost write can resurrect a released slot or forget an
// admitted job. Set sync_interval: always in the server's jetstream block
// (or a short interval, accepting the loss of that much), or run R3 buckets
// on nodes that do not fail together.
type NATSStore struct {
	js     jetstream.JetStream
	prefix string
	create *jetstream.KeyValueConfig // template for missing buckets; nil: do not create

	guards *permissionGuards // of js.Conn(), shared by its stores; see natskv_permission.go

	wakePrefix string    // WithWakeUps; "" when off
	wake       *wake.Hub // targeted wake-ups (natskv_wake.go, internal/wake); nil when off

	mu      sync.Mutex
	buckets map[string]*natsBucket
}

type natsBucket struct {
	kv           jetstream.KeyValue
	maxValueSize int
	// writePrefix is the prefix of the subjects the bucket's keys are
	// written to, "$KV.<bucket>.", behind the JetStream context's API
	// prefix or domain when it has one (as nats.go's KV layer writes),
	// when the store writes keys itself (natskv_write.go); empty when the
	// bucket is a mirror, whose writes keep the KV layer's rules.
	writePrefix string
	// stream is the bucket's stream, as its publish acks name it.
	stream string
	// writeTimeout bounds a write whose context has no deadline: the
	// JetStream context's default timeout, as in nats.go.
	writeTimeout time.Duration
	markers      markerHints
	// leaderGet is the API subject of the bucket stream's message get,
	// which the stream leader answers, when the bucket is replicated (and
	// not a mirror); empty otherwise. It carries the JetStream context's
	// API prefix or domain. kv.Get uses direct gets, which any replica may
	// answer, possibly one that has not applied the latest writes yet.
	leaderGet string
	// keySubjects is "$KV.<bucket>.", the prefix of the subjects the
	// bucket's keys are stored under, when leaderGet is set.
	keySubjects string
	// batches says the store writes successive states of a key as one
	// atomic batch (BatchWriter): the bucket's stream allows atomic
	// publish and stages a batch in memory, so that a batch costs about
	// one round trip. An R1 file-storage stream stages each batch in a
	// temporary file store (about 3.4 ms here against 70 µs for a write):
	// no batches there. Cleared when the server refuses a batch because
	// the stream no longer allows atomic publish.
	batches atomic.Bool
	// clock bounds this host's clock offset against the server that
	// stamps the bucket (natskv_clock.go).
	clock clockEstimate
}

// batchesPay reports whether atomic batches cost about one write on a
// stream with configuration cfg (see natsBucket.batches).
func batchesPay(cfg jetstream.StreamConfig) bool {
	return cfg.AllowAtomicPublish && cfg.Mirror == nil && !(cfg.Replicas <= 1 && cfg.Storage == jetstream.FileStorage)
}

// markerHintsMax bounds the delete markers a bucket remembers.
const markerHintsMax = 4096

// markerHints remembers the revision of the delete markers this store wrote
// last, so that Create on such a key is one conditional write instead of
// kv.Create's three round trips (a write that fails on the marker, a read,
// a write). A hint is only a guess: a wrong one costs one failed write.
type markerHints struct {
	revs boundedmap.Map[string, uint64] // Max: markerHintsMax, set by the bucket's opening
}

func (h *markerHints) put(key string, rev uint64) { h.revs.Put(key, rev) }

// take returns and forgets the hint for key.
func (h *markerHints) take(key string) (uint64, bool) { return h.revs.Take(key) }

var _ Store = (*NATSStore)(nil)

// NATSStoreOption configures a [NATSStore].
type NATSStoreOption func(*NATSStore) error

var bucketTokenRe = regexp.MustCompile(`^[A-Za-z0-9_-]+$`)

// WithBucketPrefix sets the bucket name prefix (default BucketPrefixDefault):
// a service's bucket is <prefix>_<service>. It must consist of letters,
// digits, '_' and '-'.
func WithBucketPrefix(prefix string) NATSStoreOption {
	return func(s *NATSStore) error {
		if !bucketTokenRe.MatchString(prefix) {
			return fmt.Errorf("%w: bucket prefix %q must be letters, digits, '_' or '-'", ErrInvalidName, prefix)
		}
		s.prefix = prefix
		return nil
	}
}

// WithCreateBuckets makes the store create a missing bucket with history 1
// and the given storage and replicas (1 to 5), and with atomic batch
// publish allowed on its stream (AllowAtomicPublish, nats-server 2.12 or
// later; a server that does not know it ignores it), so that the store
// can write several successive states of a key in one round trip where
// that pays (memory storage, or replicated file storage). Without it a
// missing bucket is an error wrapping ErrBucketNotFound.
func WithCreateBuckets(storage jetstream.StorageType, replicas int) NATSStoreOption {
	return func(s *NATSStore) error {
		if err := kvstream.CheckStorage(storage, replicas); err != nil {
			return fmt.Errorf("%w: %v", ErrInvalidRequest, err)
		}
		s.create = &jetstream.KeyValueConfig{History: 1, Storage: storage, Replicas: replicas}
		return nil
	}
}

// WithWakeUps turns on targeted wake-ups for every [KeyCoordinator] and
// [Watcher] over the store: a write that leaves slots of a key free sends
// the state it wrote, on core NATS, to the first jobs of the key's queue,
// as many as there are free slots, whose blocked [Runner]s subscribe to a
// subject of their own job (no KV watch), so that a release wakes as many
// waiters as it frees slots. Each process (each store) delivers to its
// own waiters in memory, with the state, on which they acquire without
// reading the key. A wake-up from another process is a hint: anyone
// allowed to publish on its subject can send any revision and state, so
// its waiter keeps only the revision and reads the key before it writes,
// unless its coordinator holds that revision already (the Watcher's
// watch, its own write). See docs/keys.md, "Targeted wake-ups", for what is
// left to a Runner's RecheckInterval.
//
// The subject of job J of KV key K in bucket B (see
// [NATSStore.BucketName]) is "<prefix>.B.K.T", T the unpadded base64url
// encoding of the first 16 bytes of SHA-256(J); the payload is the
// state's revision, 8 bytes big-endian, followed by its value exactly as
// stored in KV. A publish carries a reply subject under the connection's
// inbox prefix, where the server's "no responders" answer tells the store
// to try the next job of the queue. The KV wire format is unchanged.
//
// prefix "" means [WakePrefixDefault] ("jobkeys.wake"). A prefix is
// dot-separated tokens of letters, digits, '_' and '-', at most
// [WakePrefixMaxLength] bytes; a bad one, or one that could overlap the
// connection's inbox subjects or the JetStream API's, is an error wrapping
// [ErrInvalidRequest] that names it.
//
// The user needs permission to publish and to subscribe to
// "<prefix>.<bucket>.>" for each bucket it uses, and to subscribe to the
// connection's inbox prefix (as requests already need). A refused wake-up
// subject fails no store call: the wake-up is lost, and the waiter learns
// of the change by its Runner's RecheckInterval. Publishing there allows
// no write to the bucket: at most a read per wake-up by the waiter it
// reaches, and that job trying at once; subscribing there allows reading
// the states wake-ups carry (see the README's permissions).
//
// Every process sharing the buckets should turn it on: a writer without
// it (and the TypeScript original) sends no wake-ups, and waiters woken
// only by wake-ups then wait for their Runner's RecheckInterval or a
// lease expiry, which read the key.
func WithWakeUps(prefix string) NATSStoreOption {
	return func(s *NATSStore) error {
		if prefix == "" {
			prefix = WakePrefixDefault
		}
		if err := validateWakePrefix(prefix); err != nil {
			return err
		}
		s.wakePrefix = prefix
		return nil
	}
}

// NewNATSStore returns a store over js. Nothing is opened until first use.
func NewNATSStore(js jetstream.JetStream, opts ...NATSStoreOption) (*NATSStore, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: jetstream.JetStream is nil", ErrInvalidRequest)
	}
	s := &NATSStore{js: js, prefix: BucketPrefixDefault, buckets: make(map[string]*natsBucket)}
	for _, opt := range opts {
		if err := opt(s); err != nil {
			return nil, err
		}
	}
	s.guards = connectionGuards(js.Conn())
	if s.wakePrefix != "" {
		h, err := newWakeHub(s.wakePrefix, js, s.guards)
		if err != nil {
			return nil, err
		}
		s.wake = h
	}
	return s, nil
}

// begin starts a call of kind on service's bucket: it returns the context
// the call must use and its guard, which the caller must end with done. A
// connection whose inbox subscription the server refused fails at once.
func (s *NATSStore) begin(ctx context.Context, kind natsOpKind, service, op, key string) (context.Context, *permissionGuard, error) {
	if v := s.guards.refusedInbox(s.js.Conn()); v != nil {
		return nil, nil, fmt.Errorf("%w: %s %s: %v", ErrPermission, op, key, v)
	}
	gctx, pg := s.guards.guard(ctx, kind, s.prefix, service)
	return gctx, pg, nil
}

// BucketName returns the name of the bucket that holds service's keys.
func (s *NATSStore) BucketName(service string) string { return s.prefix + "_" + service }

// bucket opens (or creates) service's bucket once and caches it.
func (s *NATSStore) bucket(ctx context.Context, service string) (*natsBucket, error) {
	s.mu.Lock()
	b := s.buckets[service]
	s.mu.Unlock()
	if b != nil {
		return b, nil
	}
	if err := validateService(service); err != nil {
		return nil, err
	}
	name := s.BucketName(service)
	kv, err := s.js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) && s.create != nil {
		cfg := *s.create
		cfg.Bucket = name
		cfg.Description = "jobkeys key state of service " + service
		// The creation and the stream update run under guards of their
		// own (the call's guard does not know their subjects): a refused
		// creation fails at once with ErrPermission, a refused update
		// leaves a bucket without atomic publish.
		cctx, cg := s.guards.guardAPI(ctx, natsOpCreate, s.prefix, service, jscas.APIPrefix(s.js.Options()))
		var created bool
		kv, created, err = kvstream.Create(cctx, s.js, cfg)
		var v *permissionViolation
		if err != nil && ctx.Err() == nil && errors.As(context.Cause(cctx), &v) {
			err = fmt.Errorf("%w: create KV bucket %q (service %q): %v", ErrPermission, name, service, v)
		}
		cg.done()
		if created {
			uctx, ug := s.guards.guard(ctx, natsOpUpdateStream, s.prefix, service)
			if allowAtomicPublish(uctx, s.js, "KV_"+name) != nil && ctx.Err() != nil {
				// Without atomic publish the bucket works, one write per
				// state (a missing STREAM.UPDATE permission, say); an
				// ended call does not.
				err = ctx.Err()
			}
			ug.done()
		}
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: KV bucket %q (service %q) does not exist; create it or use WithCreateBuckets", ErrBucketNotFound, name, service)
	}
	if err != nil {
		return nil, fmt.Errorf("jobkeys: open KV bucket %q: %w", name, err)
	}
	sent := time.Now()
	status, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("jobkeys: status of KV bucket %q: %w", name, err)
	}
	replied := time.Now()
	limit := int(s.js.Conn().MaxPayload()) - headerAllowance
	if mv := int(status.Config().MaxValueSize); mv > 0 && mv-headerAllowance < limit {
		limit = mv - headerAllowance
	}
	b = &natsBucket{kv: kv, maxValueSize: limit}
	b.markers.revs.Max = markerHintsMax
	b.observeStatus(status, sent, replied) // see natskv_clock.go
	opts := s.js.Options()
	if info := bucketStreamInfo(status); info != nil && info.Config.Mirror == nil {
		b.stream, b.writeTimeout = info.Config.Name, opts.DefaultTimeout
		b.writePrefix = jscas.WritePrefix(opts, kv.Bucket())
		if info.Config.Replicas > 1 {
			b.leaderGet = jscas.APIPrefix(opts) + "STREAM.MSG.GET." + info.Config.Name
			b.keySubjects = "$KV." + kv.Bucket() + "."
		}
		b.batches.Store(batchesPay(info.Config))
	}
	s.mu.Lock()
	if prev := s.buckets[service]; prev != nil {
		b = prev
	} else {
		s.buckets[service] = b
	}
	s.mu.Unlock()
	return b, nil
}

// allowAtomicPublish allows atomic batch publish on the stream of a bucket
// the store just created (KeyValueConfig has no field for it).
func allowAtomicPublish(ctx context.Context, js jetstream.JetStream, stream string) error {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("allow atomic publish on stream %q: %w", stream, err)
	}
	_, err = kvstream.Allow(ctx, js, st, kvstream.Features{AtomicPublish: true})
	return err
}

// KeyValue returns the opened KV bucket of service, for callers that need
// more of the bucket than the Store methods give (watching, listing keys).
func (s *NATSStore) KeyValue(ctx context.Context, service string) (jetstream.KeyValue, error) {
	gctx, pg, err := s.begin(ctx, natsOpRead, service, "open the bucket of service", service)
	if err != nil {
		return nil, err
	}
	defer pg.done()
	kv, err := s.keyValue(gctx, service)
	return kv, explainPermission(ctx, gctx, "open the bucket of service", service, err)
}

// MaxValueSize returns the largest value service's bucket takes (see
// ValueLimiter), opening the bucket under the permission guard like every
// other call.
func (s *NATSStore) MaxValueSize(ctx context.Context, service string) (int, error) {
	gctx, pg, err := s.begin(ctx, natsOpRead, service, "open the bucket of service", service)
	if err != nil {
		return 0, err
	}
	defer pg.done()
	b, err := s.bucket(gctx, service)
	if err != nil {
		return 0, explainPermission(ctx, gctx, "open the bucket of service", service, err)
	}
	return b.maxValueSize, nil
}

func (s *NATSStore) keyValue(ctx context.Context, service string) (jetstream.KeyValue, error) {
	b, err := s.bucket(ctx, service)
	if err != nil {
		return nil, err
	}
	return b.kv, nil
}

// Get implements [Store].
func (s *NATSStore) Get(ctx context.Context, service, key string) ([]byte, uint64, error) {
	gctx, pg, err := s.begin(ctx, natsOpRead, service, "get", key)
	if err != nil {
		return nil, 0, err
	}
	defer pg.done()
	value, rev, err := s.getKey(gctx, service, key)
	return value, rev, explainPermission(ctx, gctx, "get", key, err)
}

func (s *NATSStore) getKey(ctx context.Context, service, key string) ([]byte, uint64, error) {
	b, err := s.bucket(ctx, service)
	if err != nil {
		return nil, 0, err
	}
	if b.leaderGet != "" && validKVKey(key) {
		return s.getFromLeader(ctx, b, key)
	}
	e, err := b.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, fmt.Errorf("%w: %s: %w", ErrKeyNotFound, key, err)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("jobkeys: get %s: %w", key, err)
	}
	b.clock.observeStamp(e.Created(), time.Now())
	return e.Value(), e.Revision(), nil
}

// getFromLeader reads key's last message through the stream leader, so that
// a read on a replicated bucket sees every write acknowledged before it
// (a direct get may be served by a lagging replica). Delete and purge
// markers read as absent, as in kv.Get.
func (s *NATSStore) getFromLeader(ctx context.Context, b *natsBucket, key string) ([]byte, uint64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.js.Options().DefaultTimeout)
		defer cancel()
	}
	req, err := kvstream.LastBySubjectRequest(b.keySubjects + key)
	if err != nil {
		return nil, 0, fmt.Errorf("jobkeys: get %s from the stream leader: %w", key, err)
	}
	msg, err := s.js.Conn().RequestWithContext(ctx, b.leaderGet, req)
	if err != nil {
		return nil, 0, fmt.Errorf("jobkeys: get %s from the stream leader: %w", key, err)
	}
	m, found, err := kvstream.ParseMsgGet(msg.Data)
	if err != nil {
		return nil, 0, fmt.Errorf("jobkeys: get %s from the stream leader: %w", key, err)
	}
	if !found {
		return nil, 0, fmt.Errorf("%w: %s", ErrKeyNotFound, key)
	}
	b.clock.observeStamp(m.Time, time.Now())
	deleted, err := kvstream.Deleted(m.Hdrs)
	if err != nil {
		return nil, 0, fmt.Errorf("jobkeys: get %s from the stream leader: %w", key, err)
	}
	if deleted {
		return nil, 0, fmt.Errorf("%w: %s (deleted at revision %d)", ErrKeyNotFound, key, m.Seq)
	}
	return m.Data, m.Seq, nil
}

// Create implements [Store].
func (s *NATSStore) Create(ctx context.Context, service, key string, value []byte) (uint64, error) {
	gctx, pg, err := s.begin(ctx, natsOpRead|natsOpWrite, service, "create", key)
	if err != nil {
		return 0, err
	}
	defer pg.done()
	rev, err := s.createKey(gctx, service, key, value)
	return rev, explainPermission(ctx, gctx, "create", key, err)
}

func (s *NATSStore) createKey(ctx context.Context, service, key string, value []byte) (uint64, error) {
	b, err := s.bucket(ctx, service)
	if err != nil {
		return 0, err
	}
	if len(value) > b.maxValueSize {
		return 0, tooLarge(len(value), b.maxValueSize)
	}
	if markerRev, ok := b.markers.take(key); ok {
		// The key was deleted by this store at markerRev: write over the
		// marker, unless the key changed since.
		rev, err := s.update(ctx, b, key, value, markerRev)
		if err == nil || !jscas.IsConflict(err) {
			return rev, casError("create", key, err)
		}
	}
	rev, err := b.kv.Create(ctx, key, value)
	return rev, casError("create", key, err)
}

// Update implements [Store].
func (s *NATSStore) Update(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	gctx, pg, err := s.begin(ctx, natsOpWrite, service, "update", key)
	if err != nil {
		return 0, err
	}
	defer pg.done()
	rev, err := s.updateKey(gctx, service, key, value, revision)
	return rev, explainPermission(ctx, gctx, "update", key, err)
}

func (s *NATSStore) updateKey(ctx context.Context, service, key string, value []byte, revision uint64) (uint64, error) {
	b, err := s.bucket(ctx, service)
	if err != nil {
		return 0, err
	}
	if len(value) > b.maxValueSize {
		return 0, tooLarge(len(value), b.maxValueSize)
	}
	if revision == 0 {
		// Revision 0 means "no message" to the server; Store.Update never
		// matches a missing key.
		return 0, fmt.Errorf("%w: update %s: revision 0", ErrRevisionConflict, key)
	}
	rev, err := s.update(ctx, b, key, value, revision)
	return rev, casError("update", key, err)
}

// update is kv.Update on b, written by the store itself where it can.
func (s *NATSStore) update(ctx context.Context, b *natsBucket, key string, value []byte, revision uint64) (uint64, error) {
	if b.directWrites(key) {
		return s.writeKey(ctx, b, key, value, revision, false)
	}
	return b.kv.Update(ctx, key, value, revision)
}

// Delete implements [Store]. It writes a delete marker, which readers
// (those of nats.go and of other clients alike) treat as absent.
func (s *NATSStore) Delete(ctx context.Context, service, key string, revision uint64) error {
	gctx, pg, err := s.begin(ctx, natsOpWrite, service, "delete", key)
	if err != nil {
		return err
	}
	defer pg.done()
	return explainPermission(ctx, gctx, "delete", key, s.deleteKey(gctx, service, key, revision))
}

func (s *NATSStore) deleteKey(ctx context.Context, service, key string, revision uint64) error {
	b, err := s.bucket(ctx, service)
	if err != nil {
		return err
	}
	if revision == 0 {
		return fmt.Errorf("%w: delete %s: revision 0", ErrRevisionConflict, key)
	}
	if !b.directWrites(key) {
		return casError("delete", key, b.kv.Delete(ctx, key, jetstream.LastRevision(revision)))
	}
	// The same marker kv.Delete writes, published here to learn its
	// revision, which kv.Delete does not return.
	rev, err := s.writeKey(ctx, b, key, nil, revision, true)
	if err != nil {
		return casError("delete", key, err)
	}
	b.markers.put(key, rev)
	return nil
}

// bucketStreamInfo returns the stream info behind a bucket's status, or nil
// when the status does not carry it.
func bucketStreamInfo(status jetstream.KeyValueStatus) *jetstream.StreamInfo {
	if bs, ok := status.(*jetstream.KeyValueBucketStatus); ok {
		return bs.StreamInfo()
	}
	return nil
}

// validKVKey reports whether key is a valid KV key by nats.go's rules:
// letters, digits and "-/_=.", no empty token.
func validKVKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '/', c == '_', c == '=':
		case c == '.' && key[i-1] != '.':
		default:
			return false
		}
	}
	return true
}

func tooLarge(n, limit int) error {
	return fmt.Errorf("%w: %d bytes exceed the bucket's limit of %d (server max_payload or bucket max value size, less %d bytes for headers)",
		ErrStateTooLarge, n, limit, headerAllowance)
}

// casError maps a compare-and-swap conflict to ErrRevisionConflict by
// JetStream error code: 10071 (wrong last sequence) and 10164 (the same on
// replicated streams while a write is in flight).
func casError(op, key string, err error) error {
	if err == nil {
		return nil
	}
	if jscas.IsConflict(err) {
		return fmt.Errorf("%w: %s %s: %w", ErrRevisionConflict, op, key, err)
	}
	return fmt.Errorf("jobkeys: %s %s: %w", op, key, err)
}
