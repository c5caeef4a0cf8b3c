package jobs

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jobkeys/jobkeys/internal/jscas"
	"github.com/jobkeys/jobkeys/internal/kvstream"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
)

// NATSBucketDefault is the KV bucket a [NATSStore] uses unless [WithBucket]
// names another.
const NATSBucketDefault = "JOBKEYS_JOBS"

// NATSTimeoutDefault bounds each request of a [NATSStore] call whose ctx
// has no deadline, unless [WithTimeout] (or js's own default timeout: see
// WithTimeout) says otherwise.
//
// It bounds a request whose answer is never coming (a lost reply, a
// connection that died under it), not the latency a caller is willing to
// wait, which its ctx states. It is long because a healthy server answers
// late under load: a stream applies its writes one after another, so a
// request waits behind every request sent before it. On an
// oversubscribed machine (load 19 on 2 cores) 121 of 200 concurrent
// enqueues overran JetStream's default of 5 s and were reported as
// failures, and every one of them had been written. Too short a bound
// turns a slow success into an error whose outcome is unknown
// ([ErrOutcomeUnknown]); too long a bound only makes a caller without a
// deadline wait longer on a dead server, which is rare and which its ctx
// can bound. 30 s is six times the bound most of those writes overran.
const NATSTimeoutDefault = 30 * time.Second

// natsCASAttempts bounds the read–apply–write rounds of one call that lose
// a compare-and-swap to a concurrent writer before it gives up with
// ErrConflict.
const natsCASAttempts = 16

// casPause is the pause before round n (from 0) of a read–apply–write
// loop whose earlier rounds lost their compare-and-swaps: none before the
// first two rounds, then a random wait below 100 µs << (n−2), at most
// 10 ms, so that writers racing for the same keys stop meeting in step
// (without it, four producers and three workers on three targets once
// lost 16 rounds in a row in TestNATSStoreUnbatchedEnqueueRacesWorkers).
// It returns ctx's error if ctx ends first.
func casPause(ctx context.Context, n int) error {
	if n < 2 {
		return nil
	}
	ceiling := min(100*time.Microsecond<<min(n-2, 10), 10*time.Millisecond)
	t := time.NewTimer(rand.N(ceiling))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// NATSStore is a [Store] over one NATS JetStream KV bucket (see the layout
// in natsstore_layout.go, and the package README): every record of a
// deployment in that bucket, every change a compare-and-swap. An enqueue
// changes several keys; it is never half visible. Where an atomic batch
// costs about one write (a stream that allows atomic publish, on memory
// storage or replicated: [WithCreateBucket] allows it) it is one atomic
// batch; on an R1 file-storage stream, where the server stages each batch
// in a temporary file store (milliseconds of server CPU), and on a stream
// that does not allow atomic publish, it writes its keys one by one, the
// target's last: that write commits it, and whatever an enqueue cut short
// left behind is invisible until a replay of the request, or the next
// enqueue of its target, carries it on (see [NATSStore.Enqueue]). Claim,
// renew, progress, settle, requeue, fail and the control calls each write
// the job's one key. Revisions are stream sequences: increasing per
// channel, never reused, not contiguous; jobs claimed in one call carry
// different revisions.
//
// Claiming reads only the pending, paused and running jobs (through the
// bucket's "active" index), never the completed ones. DeleteChannel is one
// subject-filtered purge.
//
// List reads the key names of the channel's jobs (one "list" entry each,
// no values) and the values of the page's jobs only; its cost grows with
// the channel's jobs.
//
// Every decision rests on a compare-and-swap, so any number of stores, in
// any number of processes, may share a bucket. What a store remembers — the
// running jobs it wrote last, the targets and pending jobs it has seen — is
// only a guess that saves a read: a wrong one costs a failed write or an
// extra read, never a wrong result. A stored job record that does not
// validate fails every call that reads it with ErrCorrupt naming the KV
// key, until an operator repairs or removes it; Claim skips it and claims
// the rest of its channel (see [Store.Claim]).
//
// A store keeps one subscription on js's connection for the replies of
// batched reads and purges, until [NATSStore.Close] or the connection's
// end. A write that finishes a job (and a Claim that meets a finished job)
// purges the job's active entry in the background, without waiting for
// the answer; Close waits for the purges in flight.
//
// A request the server refuses for the user's permissions times out (the
// server tells only the connection's async error handler); the call's
// error (NewNATSStore's too) then wraps jobkeys.ErrPermission beside
// ErrUnavailable (or the caller's deadline's error) and names the refused
// subject. A refused background purge is logged once per store, a warning
// through [Config.Logger] (claims then read every finished job). The
// module's README lists the permissions a store's user needs.
//
// It is safe for concurrent use.
type NATSStore struct {
	js         jetstream.JetStream
	cfg        config
	kv         jetstream.KeyValue
	stream     jetstream.Stream
	streamName string
	keys       natsKeys
	// msgGet is the STREAM.MSG.GET API subject of the bucket's stream,
	// which its leader answers; directGet its DIRECT.GET subject, which
	// any replica answers.
	msgGet, directGet string
	// purge is the STREAM.PURGE API subject of the bucket's stream.
	purge string
	// replies receives the answers of batched reads and purges.
	replies natsReplies
	// purges are the background purges of active entries in flight.
	purges natsPurges
	// cache remembers the running jobs this store wrote last; targets the
	// targets it has seen stored.
	cache   natsJobCache
	targets natsKeySet
	pending natsKeySet
	lists   natsListCache
	// plainWrites is set when a compare-and-swap is one request of the
	// store's own (casWrite) rather than kv.Update: always, but in tests
	// that count kv's writes.
	plainWrites bool
	// writePrefix is the prefix of the subjects casWrite writes keys to:
	// "$KV.<bucket>.", behind js's API prefix or domain as kv.Update
	// writes.
	writePrefix string
	// leaderReads is set on replicated buckets: single-key reads go to the
	// stream leader, since a direct get may be answered by a replica that
	// has not applied the latest writes.
	leaderReads bool
	// timeout is WithTimeout's bound; 0: see requestTimeout.
	timeout time.Duration
	// batchPublish replaces the atomic batch publish in fault tests; nil:
	// jetstreamext.PublishMsgBatch.
	batchPublish func(ctx context.Context, msgs []*nats.Msg) (uint64, error)
	// unbatched is set when enqueues write their keys one by one
	// (natsstore_enqueue.go) rather than as one atomic batch: on a stream
	// where a batch costs milliseconds or is not allowed (see
	// natsBatchesPay).
	unbatched bool
	// writeCut stops an unbatched enqueue's writes in fault tests; nil:
	// never.
	writeCut *natsWriteCut
	// retention is how long finished jobs are kept (see Retention); nil:
	// for good. ttlAllowed says whether the bucket's stream allows
	// per-message TTL, which it needs.
	retention  atomic.Pointer[retention]
	ttlAllowed bool
	// gauges is the registration of the pending and running gauges
	// (Config.MeterProvider); nil: none. Close ends it.
	gauges metric.Registration
}

// natsBatchesPay reports whether an atomic batch costs about one write on
// a stream with configuration cfg: it must allow atomic publish, and not
// be an R1 file-storage stream, where the server stages each batch in a
// temporary file store (3.6–4.4 ms of server CPU per enqueue, against
// tens of microseconds for a write).
func natsBatchesPay(cfg jetstream.StreamConfig) bool {
	return cfg.AllowAtomicPublish && !(cfg.Replicas <= 1 && cfg.Storage == jetstream.FileStorage)
}

var _ Store = (*NATSStore)(nil)

// NATSStoreOption configures a [NATSStore].
type NATSStoreOption func(*natsStoreOptions) error

type natsStoreOptions struct {
	bucket   string
	create   bool
	storage  jetstream.StorageType
	replicas int
	timeout  time.Duration
}

// WithTimeout bounds each request of a call whose ctx has no deadline (a
// call with a deadline is bounded by it alone): a request unanswered by
// then fails the call with [ErrUnavailable], and a write so unanswered
// with [ErrOutcomeUnknown] too, since it may have been applied. d must be
// positive. Without it the bound is js's default timeout when js was made
// with one other than JetStream's default of 5 s
// (jetstream.WithDefaultTimeout), and [NATSTimeoutDefault] (30 s)
// otherwise.
func WithTimeout(d time.Duration) NATSStoreOption {
	return func(o *natsStoreOptions) error {
		if d <= 0 {
			return fmt.Errorf("%w: WithTimeout: timeout %v is not positive", ErrConflict, d)
		}
		o.timeout = d
		return nil
	}
}

// natsJetStreamDefaultTimeout is the default timeout of a jetstream.JetStream
// made without jetstream.WithDefaultTimeout.
const natsJetStreamDefaultTimeout = 5 * time.Second

// requestTimeout is the bound of each request of a call whose ctx has no
// deadline: WithTimeout's, else js's default timeout when it was set to
// another than JetStream's own default, else NATSTimeoutDefault. It is
// read from s.js at each call (tests swap s.js for one with a short
// timeout).
func (s *NATSStore) requestTimeout() time.Duration {
	return natsRequestTimeout(s.js, s.timeout)
}

// natsRequestTimeout is requestTimeout for js and WithTimeout's bound
// (0: none).
func natsRequestTimeout(js jetstream.JetStream, timeout time.Duration) time.Duration {
	if timeout > 0 {
		return timeout
	}
	if d := js.Options().DefaultTimeout; d > 0 && d != natsJetStreamDefaultTimeout {
		return d
	}
	return NATSTimeoutDefault
}

// WithBucket names the KV bucket (default [NATSBucketDefault]): letters,
// digits, '-' and '_', at most 64 characters.
func WithBucket(name string) NATSStoreOption {
	return func(o *natsStoreOptions) error {
		if name == "" || len(name) > 64 || strings.Trim(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_") != "" {
			return fmt.Errorf("%w: WithBucket: bucket name %q must be 1..64 letters, digits, '-' or '_'", ErrConflict, name)
		}
		o.bucket = name
		return nil
	}
}

// WithCreateBucket makes NewNATSStore create the bucket when it is missing:
// history 1, the given storage and replicas (1 to 5), atomic batch publish
// allowed (enqueues are one batch where a batch costs about one write:
// not on R1 file storage; see [NATSStore]) and per-message TTL allowed (the
// TTL for [Retention]). Without it a missing bucket is an error wrapping
// ErrNotFound. An existing bucket is used as it is, except that atomic
// publish and per-message TTL are allowed on it when they are not yet:
// another process may have created the bucket and not yet taken that
// second step, or an older version created it without the TTL.
func WithCreateBucket(storage jetstream.StorageType, replicas int) NATSStoreOption {
	return func(o *natsStoreOptions) error {
		if err := kvstream.CheckStorage(storage, replicas); err != nil {
			return fmt.Errorf("%w: WithCreateBucket: %v", ErrConflict, err)
		}
		o.create, o.storage, o.replicas = true, storage, replicas
		return nil
	}
}

// NewNATSStore opens the store's bucket over js (creating it when
// [WithCreateBucket] is given) and returns the store; cfg is copied (nil:
// defaults, see [Config]). It fails with ErrNotFound when the bucket is
// missing, and with ErrConflict when the bucket's stream does not allow
// direct gets or is a mirror. Atomic batch publish is not needed: the
// store reads from the stream's configuration, once, whether enqueues are
// batched (see [NATSStore]; on memory storage or replicated, enqueues are
// faster with it: `nats stream edit KV_<bucket> --allow-batch`). Stores
// that decided differently may share a bucket. It waits at most the
// store's request timeout (see [WithTimeout]).
func NewNATSStore(js jetstream.JetStream, cfg *Config, opts ...NATSStoreOption) (*NATSStore, error) {
	if js == nil {
		return nil, fmt.Errorf("%w: NewNATSStore: jetstream.JetStream is nil", ErrConflict)
	}
	c, err := newConfig(cfg)
	if err != nil {
		return nil, err
	}
	o := natsStoreOptions{bucket: NATSBucketDefault}
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), natsRequestTimeout(js, o.timeout))
	defer cancel()
	kv, err := js.KeyValue(ctx, o.bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) && o.create {
		kv, err = createNATSBucket(ctx, js, o)
	}
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: NewNATSStore: KV bucket %q does not exist; create it or pass WithCreateBucket", ErrNotFound, o.bucket)
	}
	streamName := "KV_" + o.bucket
	// A refusal of one of these (or of the inbox) is named, not a bare
	// timeout; the timeout is NewNATSStore's own, not a caller's deadline.
	api := jscas.APIPrefix(js.Options())
	used := []string{api + "STREAM.INFO." + streamName, api + "INFO", api + "STREAM.CREATE." + streamName, api + "STREAM.UPDATE." + streamName}
	if err != nil {
		return nil, natsRefusedOr(context.Background(), js.Conn(), "NewNATSStore", fmt.Sprintf("open KV bucket %q", o.bucket), err, used)
	}
	stream, err := js.Stream(ctx, streamName)
	if err != nil {
		return nil, natsRefusedOr(context.Background(), js.Conn(), "NewNATSStore", fmt.Sprintf("open stream %q of KV bucket %q", streamName, o.bucket), err, used)
	}
	info := stream.CachedInfo()
	if (!info.Config.AllowAtomicPublish || !info.Config.AllowMsgTTL) && o.create {
		// Another process created the bucket and has not allowed atomic
		// publish on it yet (createNATSBucket's second step), or an older
		// version created it without per-message TTL: finish it.
		if info, err = allowAtomicPublish(ctx, js, stream); err != nil {
			return nil, natsRefusedOr(context.Background(), js.Conn(), "NewNATSStore", fmt.Sprintf("KV bucket %q", o.bucket), err, used)
		}
	}
	switch {
	case !info.Config.AllowDirect:
		return nil, fmt.Errorf("%w: NewNATSStore: stream %q of KV bucket %q does not allow direct gets, which batched reads need", ErrConflict, streamName, o.bucket)
	case info.Config.Mirror != nil || len(info.Config.Sources) > 0:
		return nil, fmt.Errorf("%w: NewNATSStore: KV bucket %q is a mirror or has sources; the store writes to the bucket itself", ErrConflict, o.bucket)
	}
	s := &NATSStore{
		js:          js,
		cfg:         c,
		kv:          kv,
		stream:      stream,
		streamName:  streamName,
		keys:        natsKeys{prefix: "$KV." + o.bucket + "."},
		msgGet:      jscas.APIPrefix(js.Options()) + "STREAM.MSG.GET." + streamName,
		directGet:   jscas.APIPrefix(js.Options()) + "DIRECT.GET." + streamName,
		purge:       jscas.APIPrefix(js.Options()) + "STREAM.PURGE." + streamName,
		plainWrites: true,
		writePrefix: jscas.WritePrefix(js.Options(), o.bucket),
		leaderReads: info.Config.Replicas > 1,
		timeout:     o.timeout,
		unbatched:   !natsBatchesPay(info.Config),
		ttlAllowed:  info.Config.AllowMsgTTL,
	}
	s.pending.keys.Max = natsPendingHintsMax
	s.lists.channels.Max = natsListCacheChannels
	s.cache.entries.Max, s.targets.keys.Max = natsJobCacheMax, natsJobCacheMax
	if s.gauges, err = c.obs.observeActive(s.countActive); err != nil {
		return nil, err
	}
	return s, nil
}

// createNATSBucket creates the bucket and allows atomic publish on its
// stream (KeyValueConfig has no field for it).
func createNATSBucket(ctx context.Context, js jetstream.JetStream, o natsStoreOptions) (jetstream.KeyValue, error) {
	kv, _, err := kvstream.Create(ctx, js, jetstream.KeyValueConfig{
		Bucket:      o.bucket,
		Description: "jobkeys job records",
		History:     1,
		Storage:     o.storage,
		Replicas:    o.replicas,
	}) // or opened, when created concurrently
	if err != nil {
		return nil, err
	}
	stream, err := js.Stream(ctx, "KV_"+o.bucket)
	if err != nil {
		return nil, err
	}
	if _, err := allowAtomicPublish(ctx, js, stream); err != nil {
		return nil, err
	}
	return kv, nil
}

// allowAtomicPublish allows atomic batch publish and per-message TTL on
// stream if it does not yet, and returns the stream's info as it is then.
// Any number of processes may do it at once.
func allowAtomicPublish(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream) (*jetstream.StreamInfo, error) {
	return kvstream.Allow(ctx, js, stream, kvstream.Features{AtomicPublish: true, MsgTTL: true})
}

// Bucket returns the name of the store's KV bucket.
func (s *NATSStore) Bucket() string {
	return strings.TrimSuffix(strings.TrimPrefix(s.keys.prefix, "$KV."), ".")
}

// readJob reads and decodes a job. found is false when the channel has no
// such job. entryRev is the KV entry's revision, which a compare-and-swap
// presents (the job's Revision may be later: see RevisionOffset).
func (s *NATSStore) readJob(ctx context.Context, op, channelID, jobID string) (j Job, art *Artifact, entryRev uint64, found bool, err error) {
	j, art, entryRev, _, found, err = s.readJobMeta(ctx, op, channelID, jobID)
	return j, art, entryRev, found, err
}

// readJobMeta is readJob that also returns the sequence of the job's active
// entry (0: unknown). A record an unbatched enqueue marked is resolved
// against its target (see readJobFull): a staged job not committed is not
// found.
func (s *NATSStore) readJobMeta(ctx context.Context, op, channelID, jobID string) (j Job, art *Artifact, entryRev, activeSeq uint64, found bool, err error) {
	rd, err := s.readJobFull(ctx, op, channelID, jobID)
	if err != nil || !rd.found {
		return Job{}, nil, 0, 0, false, err
	}
	return rd.job, rd.raw.art, rd.raw.rev, rd.raw.activeSeq, true, nil
}

// Enqueue implements [Store.Enqueue]. Where the bucket's enqueues are
// batched (see [NATSStore]) the job, its idempotency record, its target,
// its list and active entries and the job it supersedes are written in
// one atomic batch, each key with the revision it was read at: a
// concurrent enqueue for the same key, id or target makes the batch fail
// whole, and the enqueue reads again. Elsewhere they are written one by
// one, in this order: the idempotency record and the job's record (both
// created, the job's marked staged), the superseded job's record (marked
// superseded once the target moves past it), the job's list and active
// entries, and the target (at the revision read), which commits the
// enqueue; readers resolve the marks against the target, so the jobs and
// the channel carry the commit's revision as with a batch, and a job whose
// enqueue did not commit is found by no call. A concurrent enqueue for the
// same key, id or target makes one of the conditional writes fail, and the
// enqueue reads again and carries on from what is written.
//
// A write whose answer does not come (a timeout, a lost connection, the
// caller's ctx ending after it was sent) may have been applied: the error
// wraps [ErrOutcomeUnknown] and names the job and its idempotency key, and
// a replay of the request returns the job if the enqueue was committed
// (Repeated), and otherwise writes or finishes it. So does a replay after
// the writer died part way; another enqueue of the same target in the
// meantime commits over the unfinished one, which the replay then writes
// as the target's newest job.
func (s *NATSStore) Enqueue(ctx context.Context, req EnqueueRequest) (Enqueued, error) {
	return observe(ctx, s.cfg.obs, trEnqueue, s.enqueue, req)
}

// enqueue is Enqueue without its metrics.
func (s *NATSStore) enqueue(ctx context.Context, req EnqueueRequest) (Enqueued, error) {
	const op = "enqueue"
	req, err := prepareEnqueue(req)
	if err != nil {
		return Enqueued{}, err
	}
	if err := s.cfg.guard(ctx, op); err != nil {
		return Enqueued{}, err
	}
	if err := s.cfg.channelExists(ctx, op, req.ChannelID); err != nil {
		return Enqueued{}, err
	}
	idemKey := s.keys.idem(req.ChannelID, req.IdempotencyKey)
	jobKey := s.keys.job(req.ChannelID, req.ID)
	targetKey := s.keys.target(req.ChannelID, req.TargetKey)
	optimistic := !s.targets.has(targetKey)
	if s.unbatched {
		return s.enqueueStaged(ctx, req, !optimistic)
	}
	for round := range natsCASAttempts {
		if err := casPause(ctx, round); err != nil {
			return Enqueued{}, err
		}
		var read map[string]natsMsg
		guess := optimistic
		optimistic = false
		if !guess {
			var err error
			if read, err = s.getMany(ctx, op, []string{idemKey, jobKey, targetKey}); err != nil {
				return Enqueued{}, err
			}
		}
		if m, ok := read[idemKey]; ok {
			return s.replay(ctx, req, idemKey, m, read)
		}
		_, taken := read[jobKey]
		if err := checkNewJob(req, taken); err != nil {
			if guess {
				continue // a replay comes first: read
			}
			return Enqueued{}, err
		}
		var generation, targetRev, prevRev, prevActive uint64
		var prev *Job
		if m, ok := read[targetKey]; ok {
			t, err := decodeNATSTarget(targetKey, m.rev, m.data)
			if err != nil {
				return Enqueued{}, err
			}
			generation, targetRev = t.Generation, m.rev
			s.targets.add(targetKey)
			rd, err := s.readJobFull(ctx, op, req.ChannelID, t.JobID)
			if err != nil {
				return Enqueued{}, err
			}
			if st := rd.raw.marks.staged; rd.found && st != nil && st.Prev != "" {
				// Its unbatched enqueue unfinished: the job it superseded
				// written for good first, as its first change would.
				if err := s.finishPrev(ctx, op, &rd.job, st.Prev, rd.target.rev); err != nil {
					return Enqueued{}, err
				}
			}
			if rd.found {
				prev, prevRev, prevActive = &rd.job, rd.raw.rev, rd.raw.activeSeq
			}
		}
		var targetJobs []Job
		if prev != nil {
			targetJobs = []Job{*prev}
		}
		now := s.cfg.now()
		j, t, superseded := enqueueJob(req, generation, targetJobs, now, 0)
		msgs, err := s.enqueueBatch(&j, t, targetRev, superseded, prevRev, prevActive)
		if err != nil {
			return Enqueued{}, err
		}
		sent := time.Now() // the superseded job's retention runs from its write
		rev, conflict, err := s.publishBatch(ctx, op, msgs)
		if errors.Is(err, ErrOutcomeUnknown) {
			return Enqueued{}, fmt.Errorf("%s: job %q in channel %q (idempotency key %q) may have been written; replay the request (the same idempotency key and fingerprint): it returns the job if it was, and writes it if not: %w",
				op, req.ID, req.ChannelID, req.IdempotencyKey, err)
		}
		if err != nil {
			return Enqueued{}, err
		}
		if conflict {
			continue
		}
		s.targets.add(targetKey)
		s.pending.add(jobKey)
		j.Revision = rev // the superseded job's too, by its RevisionOffset
		out := Enqueued{Job: cloneJob(j)}
		for _, p := range superseded {
			s.dropActive(ctx, s.keys.active(p.ChannelID, p.ID), activeBound(prevActive, rev))
			p.Revision = rev
			out.Superseded = append(out.Superseded, cloneJob(p))
			s.retireSuperseded(ctx, op, &p, sent) // the batch wrote its record with its retention; now its entries
		}
		return out, nil
	}
	return Enqueued{}, conflictf("%s: job %q in channel %q: its keys changed concurrently %d times in a row", op, req.ID, req.ChannelID, natsCASAttempts)
}

// enqueueBatch builds the writes of an enqueue; the job comes last, so its
// revision is the batch's last sequence, and the superseded job (at most
// one: only a target's newest job can be active) just before it, written
// over prevRev.
func (s *NATSStore) enqueueBatch(j *Job, t Target, targetRev uint64, superseded []Job, prevRev, prevActive uint64) ([]natsBatchMsg, error) {
	target, err := encodeNATSTarget(natsTargetRecord{Generation: t.Generation, JobID: j.ID})
	if err != nil {
		return nil, err
	}
	idem, err := encodeNATSIdem(natsIdemRecord{JobID: j.ID, Fingerprint: j.Fingerprint})
	if err != nil {
		return nil, err
	}
	// The active entry is the fourth write; the job the last, after the
	// superseded one if any.
	job, err := encodeNATSJobMeta(j, nil, natsMeta{activeOffset: uint64(1 + len(superseded))})
	if err != nil {
		return nil, err
	}
	msgs := []natsBatchMsg{
		{key: s.keys.target(j.ChannelID, j.TargetKey), value: target, expect: targetRev, check: true},
		{key: s.keys.idem(j.ChannelID, j.IdempotencyKey), value: idem, expect: 0, check: true},
		{key: s.keys.list(j.ChannelID, j.CreatedAt, j.ID)},
		{key: s.keys.active(j.ChannelID, j.ID)},
	}
	if len(superseded) > 1 {
		return nil, fmt.Errorf("%w: enqueue: target %q has %d active jobs; only its newest can be", ErrCorrupt, j.TargetKey, len(superseded))
	}
	for i := range superseded {
		p := &superseded[i]
		v, err := encodeNATSJobMeta(p, nil, natsMeta{revOffset: 1, activeSeq: prevActive})
		if err != nil {
			return nil, err
		}
		msgs = append(msgs, natsBatchMsg{key: s.keys.job(p.ChannelID, p.ID), value: v, expect: prevRev, check: true, ttl: s.finalTTL(p.State)})
	}
	msgs = append(msgs, natsBatchMsg{key: s.keys.job(j.ChannelID, j.ID), value: job, expect: 0, check: true})
	return msgs, nil
}

// replay answers an enqueue whose idempotency key is stored.
func (s *NATSStore) replay(ctx context.Context, req EnqueueRequest, idemKey string, m natsMsg, read map[string]natsMsg) (Enqueued, error) {
	idem, err := decodeNATSIdem(idemKey, m.rev, m.data)
	if err != nil {
		return Enqueued{}, err
	}
	var j Job
	key := s.keys.job(req.ChannelID, idem.JobID)
	jm, ok := read[key]
	if !ok {
		if jm, ok, err = s.getOne(ctx, "enqueue", key); err != nil {
			return Enqueued{}, err
		}
	}
	var marks natsMarks
	if ok {
		if j, _, _, marks, err = decodeNATSJobStaged(key, jm.rev, jm.data, req.ChannelID, idem.JobID); err != nil {
			return Enqueued{}, err
		}
	}
	if !ok || marks.any() || j.IdempotencyKey != req.IdempotencyKey {
		// An enqueue written key by key (the stream allowed no batch
		// when it was written), maybe not finished: answered as that
		// path answers it.
		return s.enqueueStaged(ctx, req, true)
	}
	out, err := replay(req, &j)
	if err != nil {
		return Enqueued{}, err
	}
	out.Job = cloneJob(out.Job)
	return out, nil
}

// ClaimJob implements [Store.ClaimJob]: one compare-and-swap on the job's
// key (after its read).
func (s *NATSStore) ClaimJob(ctx context.Context, req ClaimJobRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trClaim, s.claimJob, req)
}

// claimJob is ClaimJob without its metrics.
func (s *NATSStore) claimJob(ctx context.Context, req ClaimJobRequest) (Job, error) {
	req, err := prepareClaimJob(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "claim job", req.ChannelID, req.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return claimNamedJob(j, req, gen, now, rev)
	}))
	if err == nil {
		s.pending.remove(s.keys.job(req.ChannelID, req.JobID))
	}
	return j, err
}

// listActive reads the active entries of a channel (every channel when
// channelID is empty) and, in the same request, the records of the job
// keys in also: a consistent snapshot of both. With more entries than one
// batched read answers it lists the entries alone.
func (s *NATSStore) listActive(ctx context.Context, op, channelID string, also []string) (entries, jobs map[string]natsMsg, err error) {
	filters := make([]string, 0, 1+len(also))
	filters = append(filters, s.keys.activeFilter(channelID))
	for _, k := range also {
		filters = append(filters, s.keys.subject(k))
	}
	entries = make(map[string]natsMsg, 1+len(also))
	err = s.batchGet(ctx, op, filters, natsBatchGetMax, entries)
	if errors.Is(err, errTooManyResults) || errors.Is(err, errBatchCut) {
		entries, err = s.lastMatching(ctx, op, s.keys.activeFilter(channelID))
		return entries, map[string]natsMsg{}, err
	}
	if err != nil {
		return nil, nil, err
	}
	jobs = make(map[string]natsMsg, len(also))
	for k, m := range entries {
		if !strings.HasPrefix(k, familyActive+".") {
			jobs[k] = m
			delete(entries, k)
		}
	}
	return entries, jobs, nil
}

// change runs the read–rule–write round of a single-job call: it reads the
// job, applies rule (generation: the job's own, see Claim), writes the
// result over the revision read, and reads again when another writer came
// first. rule errors are returned as they are.
func (s *NATSStore) change(ctx context.Context, op, channelID, jobID string,
	rule func(j *Job, generation uint64, now time.Time) (Job, *Artifact, error)) (Job, *Artifact, error) {
	if err := s.cfg.guard(ctx, op); err != nil {
		return Job{}, nil, err
	}
	return s.apply(ctx, op, channelID, jobID, rule)
}

// apply is change after the guard: each round reads the job (from the
// cache on the first when it holds the job), applies rule, writes the
// result over the revision read (applyWrite) and, once written, does what
// the write leaves to do (applied); a write that lost to another writer's
// starts the next round.
func (s *NATSStore) apply(ctx context.Context, op, channelID, jobID string,
	rule func(j *Job, generation uint64, now time.Time) (Job, *Artifact, error)) (Job, *Artifact, error) {
	key := s.keys.job(channelID, jobID)
	cached, useCache := s.cache.get(key)
	for round := range natsCASAttempts {
		if err := casPause(ctx, round); err != nil {
			return Job{}, nil, err
		}
		fromCache := useCache
		useCache = false
		cur, err := s.applyRead(ctx, op, channelID, jobID, cached, fromCache)
		if err != nil {
			return Job{}, nil, err
		}
		var jp *Job
		var gen uint64
		if cur.found {
			jp, gen = &cur.stored, cur.stored.TargetGeneration
		}
		next, art, err := rule(jp, gen, s.cfg.now())
		if err != nil && fromCache {
			continue // the remembered job may be outdated: ask the stored one
		}
		if err != nil {
			return Job{}, nil, err
		}
		if art == nil && cur.art != nil {
			art = cur.art // never dropped; a completed job does not change
		}
		w, written, err := s.applyWrite(ctx, op, key, channelID, &cur, &next, art)
		if err != nil {
			return Job{}, nil, err
		}
		if !written {
			s.cache.drop(key)
			continue
		}
		next, art = s.applied(ctx, op, key, channelID, jobID, next, art, cur.activeSeq, w)
		return cloneJob(next), cloneArtifact(art), nil
	}
	return Job{}, nil, conflictf("%s: job %q in channel %q changed concurrently %d times in a row", op, jobID, channelID, natsCASAttempts)
}

// natsApplyRead is the job a round of apply starts from.
type natsApplyRead struct {
	stored         Job
	art            *Artifact // the stored artifact; nil from the cache
	found          bool
	rev, activeSeq uint64
	rd             natsJobRead // its marks and target (natsstore_enqueue.go)
}

// applyRead returns the job apply's round starts from: cached when
// fromCache, else read (not found for an empty channel or job id, which
// is no key; the rule reports it).
func (s *NATSStore) applyRead(ctx context.Context, op, channelID, jobID string, cached natsCached, fromCache bool) (natsApplyRead, error) {
	switch {
	case fromCache:
		return natsApplyRead{stored: cached.job, rev: cached.rev, activeSeq: cached.activeSeq, found: true,
			rd: natsJobRead{raw: natsRawJob{rev: cached.rev, activeSeq: cached.activeSeq, marks: cached.marks}, target: cached.target}}, nil
	case channelID == "" || jobID == "":
		return natsApplyRead{}, nil
	}
	rd, err := s.readJobFull(ctx, op, channelID, jobID)
	if err != nil {
		return natsApplyRead{}, err
	}
	return natsApplyRead{stored: rd.job, art: rd.raw.art, rev: rd.raw.rev, activeSeq: rd.raw.activeSeq, found: rd.found, rd: rd}, nil
}

// natsApplyWrite is what apply's write of a job leaves to do once
// written.
type natsApplyWrite struct {
	rev  uint64
	meta natsMeta
	// ttl is the retention the write of a finished job carries (0: none);
	// sent is when the write went out; entries, with a ttl, returns the
	// job's other entries, read while the write was in flight.
	ttl     time.Duration
	sent    time.Time
	entries func() (map[string]natsMsg, error)
}

// applyWrite writes next (and art) over the revision cur was read at, to
// key, the KV key of the job in channel channelID.
// written is false when another writer came first, or when an unbatched
// enqueue that marked the job superseded-to-be committed after the read:
// the write, which kept the mark, changed nothing a reader sees, and the
// next round's rule meets the superseded job.
func (s *NATSStore) applyWrite(ctx context.Context, op, key, channelID string, cur *natsApplyRead, next *Job, art *Artifact) (w natsApplyWrite, written bool, err error) {
	w.meta = natsMeta{activeSeq: cur.activeSeq}
	if cur.rd.raw.marks.any() {
		// A record an unbatched enqueue marked (natsstore_enqueue.go).
		if w.meta.supersede, err = s.beforeWrite(ctx, op, &cur.rd.raw, cur.rd.target, &cur.stored, next); err != nil {
			return w, false, err
		}
	}
	value, err := encodeNATSJobMeta(next, art, w.meta)
	if err != nil {
		return w, false, err
	}
	w.ttl = s.finalTTL(next.State) // the write that finishes a job carries its retention
	w.sent = time.Now()
	if w.ttl > 0 {
		w.entries = s.readRetire(ctx, op, next) // while the write is in flight
	}
	rev, conflict, err := s.updateTTL(ctx, op, key, value, cur.rev, w.ttl)
	if w.entries != nil && (err != nil || conflict) {
		_, _ = w.entries()
	}
	if err != nil || conflict {
		return w, false, err
	}
	w.rev = rev
	if w.meta.supersede != nil {
		t, err := s.readTarget(ctx, op, channelID, next.TargetKey)
		if err != nil {
			return w, false, err
		}
		if t.rec.Generation > next.TargetGeneration {
			return w, false, nil
		}
	}
	return w, true, nil
}

// applied is what apply does once next (and art) is written: the
// revision set on the job, its new progress entries and its new artifact;
// the cache holds a running job it wrote without a mark, and forgets any
// other; a job no longer active loses its active entry (activeSeq: its
// sequence, 0 unknown) and, finished with a retention, is retired.
func (s *NATSStore) applied(ctx context.Context, op, key, channelID, jobID string, next Job, art *Artifact, activeSeq uint64, w natsApplyWrite) (Job, *Artifact) {
	next.Revision = w.rev
	for i := range next.Progress {
		if next.Progress[i].Revision == 0 {
			next.Progress[i].Revision = w.rev
		}
	}
	if art != nil && art.Revision == 0 {
		a := *art
		a.Revision = w.rev
		art = &a
	}
	if next.State == StateRunning && w.meta.supersede == nil {
		s.cache.put(key, next, w.rev, activeSeq)
	} else {
		s.cache.drop(key)
	}
	if !next.State.Active() {
		s.dropActive(ctx, s.keys.active(channelID, jobID), activeBound(activeSeq, w.rev))
		if w.ttl > 0 {
			s.retire(ctx, op, &next, w.ttl, w.sent, w.entries)
		}
	}
	return next, art
}

// activeBound is the purge bound for a job's active entry: just past the
// entry when its sequence is known, else the job's terminal revision (the
// entry is older; a purge bound far past it costs the server a scan of the
// sequences in between).
func activeBound(activeSeq, terminalRev uint64) uint64 {
	if activeSeq > 0 && activeSeq < terminalRev {
		return activeSeq + 1
	}
	return terminalRev
}

// single adapts a rule that returns only a job to change.
func single(rule func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error)) func(*Job, uint64, time.Time) (Job, *Artifact, error) {
	return func(j *Job, gen uint64, now time.Time) (Job, *Artifact, error) {
		c, err := rule(j, gen, now, 0)
		return c, nil, err
	}
}

// Renew implements [Store.Renew]: one compare-and-swap on the job's key.
func (s *NATSStore) Renew(ctx context.Context, req RenewRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trRenew, s.renew, req)
}

// renew is Renew without its metrics.
func (s *NATSStore) renew(ctx context.Context, req RenewRequest) (Job, error) {
	req, err := prepareRenew(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "renew", req.Claim.ChannelID, req.Claim.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return renewJob(j, req, gen, now, rev)
	}))
	return j, err
}

// Requeue implements [Store.Requeue]: one compare-and-swap on the job's key.
func (s *NATSStore) Requeue(ctx context.Context, req RequeueRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trRequeue, s.requeue, req)
}

// requeue is Requeue without its metrics.
func (s *NATSStore) requeue(ctx context.Context, req RequeueRequest) (Job, error) {
	req, err := prepareRequeue(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "requeue", req.Claim.ChannelID, req.Claim.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return requeueJob(j, req, gen, now, rev)
	}))
	return j, err
}

// AppendProgress implements [Store.AppendProgress]: one compare-and-swap on
// the job's key.
func (s *NATSStore) AppendProgress(ctx context.Context, req ProgressRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trProgress, s.appendProgress, req)
}

// appendProgress is AppendProgress without its metrics.
func (s *NATSStore) appendProgress(ctx context.Context, req ProgressRequest) (Job, error) {
	req, err := prepareProgress(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "progress", req.Claim.ChannelID, req.Claim.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return progressJob(j, req, gen, now, rev)
	}))
	return j, err
}

// Settle implements [Store.Settle]: one compare-and-swap on the job's key,
// which then holds the artifact too. The returned detail's revision is the
// settle's.
func (s *NATSStore) Settle(ctx context.Context, req SettleRequest) (Detail, error) {
	return observe(ctx, s.cfg.obs, trSettle, s.settle, req)
}

// settle is Settle without its metrics.
func (s *NATSStore) settle(ctx context.Context, req SettleRequest) (Detail, error) {
	req, err := prepareSettle(req)
	if err != nil {
		return Detail{}, err
	}
	j, art, err := s.change(ctx, "settle", req.Claim.ChannelID, req.Claim.JobID, func(j *Job, gen uint64, now time.Time) (Job, *Artifact, error) {
		c, a, err := settleJob(j, req, gen, now, 0)
		if err != nil {
			return Job{}, nil, err
		}
		return c, &a, nil
	})
	if err != nil {
		return Detail{}, err
	}
	return Detail{
		Revision: j.Revision,
		Target:   Target{ChannelID: j.ChannelID, TargetKey: j.TargetKey, Generation: j.TargetGeneration},
		Job:      j,
		Artifact: art,
	}, nil
}

// Fail implements [Store.Fail]: one compare-and-swap on the job's key.
func (s *NATSStore) Fail(ctx context.Context, req FailRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trFail, s.fail, req)
}

// fail is Fail without its metrics.
func (s *NATSStore) fail(ctx context.Context, req FailRequest) (Job, error) {
	req, err := prepareFail(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "fail", req.Claim.ChannelID, req.Claim.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return failJob(j, req, gen, now, rev)
	}))
	return j, err
}

// Pause implements [Store.Pause]: one compare-and-swap on the job's key.
func (s *NATSStore) Pause(ctx context.Context, req PauseRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trPause, s.pause, req)
}

// pause is Pause without its metrics.
func (s *NATSStore) pause(ctx context.Context, req PauseRequest) (Job, error) {
	req, err := preparePause(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "pause", req.ChannelID, req.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return pauseJob(j, req, gen, now, rev)
	}))
	return j, err
}

// Resume implements [Store.Resume]: one compare-and-swap on the job's key.
func (s *NATSStore) Resume(ctx context.Context, req ResumeRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trResume, s.resume, req)
}

// resume is Resume without its metrics.
func (s *NATSStore) resume(ctx context.Context, req ResumeRequest) (Job, error) {
	req, err := prepareResume(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "resume", req.ChannelID, req.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return resumeJob(j, req, gen, now, rev)
	}))
	return j, err
}

// Cancel implements [Store.Cancel]: one compare-and-swap on the job's key.
func (s *NATSStore) Cancel(ctx context.Context, req CancelRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trCancel, s.cancel, req)
}

// cancel is Cancel without its metrics.
func (s *NATSStore) cancel(ctx context.Context, req CancelRequest) (Job, error) {
	req, err := prepareCancel(req)
	if err != nil {
		return Job{}, err
	}
	if err := s.cfg.guardCancel(ctx, req); err != nil {
		return Job{}, err
	}
	j, _, err := s.apply(ctx, "cancel", req.ChannelID, req.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return cancelJob(j, req, gen, now, rev)
	}))
	return j, err
}

// Supersede implements [Store.Supersede]: one compare-and-swap on the job's
// key.
func (s *NATSStore) Supersede(ctx context.Context, req SupersedeRequest) (Job, error) {
	return observe(ctx, s.cfg.obs, trSupersede, s.supersede, req)
}

// supersede is Supersede without its metrics.
func (s *NATSStore) supersede(ctx context.Context, req SupersedeRequest) (Job, error) {
	req, err := prepareSupersede(req)
	if err != nil {
		return Job{}, err
	}
	j, _, err := s.change(ctx, "supersede", req.ChannelID, req.JobID, single(func(j *Job, gen uint64, now time.Time, rev uint64) (Job, error) {
		return supersedeJob(j, req, gen, now, rev)
	}))
	return j, err
}

// List implements [Store.List]. It lists the key names of the channel's
// "list" entries (every channel's when req.ChannelID is empty), which
// carry each job's creation time, pages over them, and reads the values of
// the page's jobs only. A list filtered by state or type reads the records
// of the jobs it passes over too, in batched reads, until its page is full
// and one more job passes (so that Next is exact): its cost grows with the
// jobs it skips. The sorted listing is kept for the next List of the same
// channel (or of every channel) while no list entry has been written.
func (s *NATSStore) List(ctx context.Context, req ListRequest) (Page, error) {
	const op = "list"
	req, err := prepareList(req)
	if err != nil {
		return Page{}, err
	}
	if req.ChannelID != "" {
		if err := s.cfg.channelExists(ctx, op, req.ChannelID); err != nil {
			return Page{}, err
		}
	} else if err := ctx.Err(); err != nil {
		return Page{}, err
	}
	refs, err := s.listing(ctx, op, req.ChannelID)
	if err != nil {
		return Page{}, err
	}
	rest := refs[listStart(refs, req):]
	page := Page{Jobs: make([]Summary, 0, min(len(rest), req.Limit))}
	// Unfiltered, the page is the first Limit refs (one read of their
	// records); filtered, chunks of refs are read until Limit jobs pass
	// and one more does.
	chunk := req.Limit
	if listFiltered(req) {
		chunk = max(2*req.Limit, natsListFilterChunk)
	}
	var last *Job
	for len(rest) > 0 {
		part := rest[:min(len(rest), chunk)]
		if !listFiltered(req) && len(rest) > len(part) {
			page.Next = cursorAt(part[len(part)-1])
		}
		rest = rest[len(part):]
		read, err := s.readListed(ctx, op, part)
		if err != nil {
			return Page{}, err
		}
		full := false
		for i, r := range part {
			j := read[i]
			if j == nil || !listMatches(req, j) {
				continue // gone since the listing (its channel, its retention), not committed, or filtered out
			}
			if len(page.Jobs) == req.Limit {
				page.Next = cursorAt(last) // one more passes
				full = true
				break
			}
			page.Jobs = append(page.Jobs, s.cfg.summarize(j))
			last = r
		}
		if full || !listFiltered(req) {
			break
		}
	}
	if page.Revision, err = s.listRevision(ctx, op, req.ChannelID); err != nil {
		return Page{}, err
	}
	return page, nil
}

// readListed reads the records of a listing's refs in batched reads: the
// job of each (nil when it is gone or its enqueue did not commit), in the
// refs' order. Records an enqueue wrote key by key carry marks, resolved
// against their targets, read after them.
func (s *NATSStore) readListed(ctx context.Context, op string, refs []*Job) ([]*Job, error) {
	keys := make([]string, len(refs))
	for i, r := range refs {
		keys[i] = s.keys.job(r.ChannelID, r.ID)
	}
	read, err := s.getMany(ctx, op, keys)
	if err != nil {
		return nil, err
	}
	raws := make([]*natsRawJob, len(refs))
	var targetKeys []string
	for i, r := range refs {
		m, ok := read[keys[i]]
		if !ok {
			continue
		}
		raw, err := decodeNATSRaw(keys[i], m, r.ChannelID, r.ID)
		if err != nil {
			return nil, err
		}
		raws[i] = &raw
		if raw.marks.any() {
			targetKeys = append(targetKeys, s.keys.target(r.ChannelID, raw.job.TargetKey))
		}
	}
	var targets map[string]natsMsg
	if len(targetKeys) > 0 {
		if targets, err = s.getMany(ctx, op, targetKeys); err != nil {
			return nil, err
		}
	}
	out := make([]*Job, len(refs))
	for i, raw := range raws {
		if raw == nil {
			continue
		}
		j := raw.job
		if raw.marks.any() {
			var t natsTargetRead
			tk := s.keys.target(refs[i].ChannelID, raw.job.TargetKey)
			if m, ok := targets[tk]; ok {
				rec, err := decodeNATSTarget(tk, m.rev, m.data)
				if err != nil {
					return nil, err
				}
				t = natsTargetRead{rec: rec, rev: m.rev}
			}
			var found bool
			if j, found = raw.resolve(t); !found {
				continue
			}
		}
		out[i] = &j
	}
	return out, nil
}

// natsListFilterChunk is the fewest list entries a filtered List reads the
// records of in one round.
const natsListFilterChunk = 256

// listRevision is a page's revision: the channel's, or the latest of any
// key of the bucket when listing every channel.
func (s *NATSStore) listRevision(ctx context.Context, op, channelID string) (uint64, error) {
	if channelID != "" {
		return s.channelRevision(ctx, op, channelID)
	}
	m, found, err := s.getFromLeader(ctx, op, s.keys.prefix+">")
	if err != nil || !found {
		return 0, err
	}
	return m.rev, nil
}

// listing returns the list entries of a channel (of every channel when
// channelID is empty) in list order: the kept listing while the last list
// entry is the one it was read at, else the key names of every entry.
func (s *NATSStore) listing(ctx context.Context, op, channelID string) ([]*Job, error) {
	lastMsg, found, err := s.getFromLeader(ctx, op, s.keys.listFilter(channelID))
	if err != nil {
		return nil, err
	}
	var last uint64
	if found {
		last = lastMsg.rev
	}
	if refs, ok := s.lists.get(channelID, last); ok {
		return refs, nil
	}
	var names []string
	if last > 0 {
		if names, _, err = s.subjects(ctx, op, s.keys.listFilter(channelID)); err != nil {
			return nil, err
		}
	}
	refs := make([]*Job, 0, len(names))
	for _, key := range names {
		chID, created, jobID, err := parseList(key)
		if err != nil {
			return nil, fmt.Errorf("%w: list: KV key %q: %w", ErrCorrupt, key, err)
		}
		refs = append(refs, &Job{ID: jobID, ChannelID: chID, CreatedAt: created})
	}
	slices.SortFunc(refs, listOrder)
	s.lists.put(channelID, last, refs)
	return refs, nil
}

// Get implements [Store.Get]: the job, its target and artifact, and the
// channel revision.
func (s *NATSStore) Get(ctx context.Context, channelID, jobID string) (Detail, error) {
	const op = "get"
	if err := prepareGet(channelID, jobID); err != nil {
		return Detail{}, err
	}
	if err := s.cfg.channelExists(ctx, op, channelID); err != nil {
		return Detail{}, err
	}
	j, art, _, found, err := s.readJob(ctx, op, channelID, jobID)
	if err != nil {
		return Detail{}, err
	}
	if !found {
		return Detail{}, notFoundf("%s: job %q does not exist in channel %q", op, jobID, channelID)
	}
	tk := s.keys.target(channelID, j.TargetKey)
	m, found, err := s.getOne(ctx, op, tk)
	if err != nil {
		return Detail{}, err
	}
	var t natsTargetRecord
	switch {
	case found:
		if t, err = decodeNATSTarget(tk, m.rev, m.data); err != nil {
			return Detail{}, err
		}
	case !j.State.Active():
		// Its retention removed the target entry (it goes just before
		// the record): the job's own generation was the target's.
		t.Generation = j.TargetGeneration
	default:
		return Detail{}, fmt.Errorf("%w: %s: job %q: its target record, KV key %q, does not exist", ErrCorrupt, op, jobID, tk)
	}
	rev, err := s.channelRevision(ctx, op, channelID)
	if err != nil {
		return Detail{}, err
	}
	return Detail{
		Revision: max(rev, j.Revision),
		Target:   Target{ChannelID: channelID, TargetKey: j.TargetKey, Generation: t.Generation},
		Job:      j,
		Artifact: art,
	}, nil
}

// peekJob reads job jobID of channel channelID alone: one read of its
// record, not Get's reads of its target and of the channel's revision
// (the last message of every key of the channel, which costs the server
// in proportion to the channel's keys). It is what a worker reads of a
// job it was told of (see jobPeeker). With forClaim, a pending job is
// remembered (see natsJobCache), so that the ClaimJob that follows writes
// without reading it again.
func (s *NATSStore) peekJob(ctx context.Context, channelID, jobID string, forClaim bool) (Job, error) {
	const op = "get"
	if err := prepareGet(channelID, jobID); err != nil {
		return Job{}, err
	}
	rd, err := s.readJobFull(ctx, op, channelID, jobID)
	if err != nil {
		return Job{}, err
	}
	if !rd.found {
		return Job{}, notFoundf("%s: job %q does not exist in channel %q", op, jobID, channelID)
	}
	j := rd.job
	if forClaim && j.State == StatePending {
		s.cache.putEntry(s.keys.job(channelID, jobID), natsCached{job: j, rev: rd.raw.rev, activeSeq: rd.raw.activeSeq, marks: rd.raw.marks, target: rd.target})
	}
	return j, nil
}

// DeleteChannel implements [Store.DeleteChannel]: one purge of every key of
// the channel, in every record family.
func (s *NATSStore) DeleteChannel(ctx context.Context, channelID string) error {
	const op = "delete channel"
	if err := checkString(op, "ChannelID", channelID, IdentifierSizeLimit); err != nil {
		return err
	}
	if err := s.cfg.guard(ctx, op); err != nil {
		return err
	}
	if channelID == "" {
		return nil // no channel has the empty id
	}
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(s.keys.channelFilter(channelID))); err != nil {
		return s.unavailable(ctx, op, "purge channel "+channelID, err, s.purge)
	}
	return nil
}
