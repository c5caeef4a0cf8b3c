package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/jobkeys/jobkeys"
)

// The dispatch stream of key-layer service S (see dispatcher):
//
//	stream     JOBS_DISPATCH_S, work-queue retention, message schedules allowed
//	subjects   jobkeys.dispatch.S.ready.<type>              "this job may start"
//	           jobkeys.dispatch.S.check.<type>              "see that this job was admitted"
//	           jobkeys.dispatch.S.due.<channel>.<job>       its ready schedule, when not due yet
//	           jobkeys.dispatch.S.due-check.<channel>.<job> its check's schedule
//	consumers  workers, durable, pull, filter jobkeys.dispatch.S.ready.>
//	           checkers, durable, pull, filter jobkeys.dispatch.S.check.>
//
// Every client of a service pulls from the service's one consumer, so a
// message goes to one worker of any process; a worker takes one message per
// free worker (one pull request each), so no message waits in a busy
// process while another has a free worker. A message stays unacknowledged
// while its job runs (the worker marks it in progress meanwhile): a worker
// that dies leaves it to be redelivered once AckWait passes, and the next
// worker finds the job's expired claim and takes it over. A due time is a
// message schedule (one per job: a newer one replaces it) that the server
// turns into the ready message at that time; a message handed back for a
// second or more (later) becomes such a schedule too, so that no worker
// holds a message for a job that is not due. <channel> and <job> are
// escapeToken's tokens. The stream sits beside the service's key bucket
// (JOBS_KEYS_S), as one per service.
const (
	dispatchSubjectPrefix = "jobkeys.dispatch."
	// dispatchAckWaitMin bounds below how long a delivered message waits
	// for its end (or a mark of progress) before the server delivers it
	// again: the claim's TTL and a second (see consume).
	dispatchAckWaitMin = 2 * time.Second
	// dispatchFetchWait is how long one pull request waits on the server
	// for a message; the next one follows at once. (It bounds how long a
	// cancelled wait may leave a message in flight to nobody: that message
	// comes back after AckWait.)
	dispatchFetchWait = 5 * time.Second
	// dispatchScheduleMin is the shortest delay given to the server as a
	// message schedule: the server fires schedules on a one-second wheel
	// and at least 250 ms after a change. A shorter delay is a timer in
	// the announcing process, which then publishes the ready message (a
	// process that dies first leaves the job to reconciliation).
	dispatchScheduleMin = 2 * time.Second
	// dispatchDuplicates is the stream's de-duplication window.
	dispatchDuplicates = 2 * time.Minute
)

// natsDispatcher is a dispatcher over a NATSStore's dispatch stream, for
// one key-layer service.
type natsDispatcher struct {
	js      jetstream.JetStream
	stream  jetstream.Stream
	service string
	prefix  string // jobkeys.dispatch.<service>.
	cons    map[lane]jetstream.Consumer

	mu     sync.Mutex
	timers map[*time.Timer]struct{}
	closed chan struct{}
	once   sync.Once
}

// dispatchStreamName is the dispatch stream of a key-layer service.
func dispatchStreamName(service string) string { return "JOBS_DISPATCH_" + service }

// newNATSDispatcher opens the dispatch stream of service over js,
// creating it when missing with storage and replicas. It announces; it
// takes announcements once consume made its consumer.
func newNATSDispatcher(ctx context.Context, js jetstream.JetStream, service string, storage jetstream.StorageType, replicas int) (*natsDispatcher, error) {
	name := dispatchStreamName(service)
	base := dispatchSubjectPrefix + service + "."
	stream, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		stream, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:              name,
			Description:       "jobkeys dispatch: jobs that may start",
			Subjects:          []string{base + ">"},
			Retention:         jetstream.WorkQueuePolicy,
			Storage:           storage,
			Replicas:          replicas,
			Duplicates:        dispatchDuplicates,
			AllowMsgSchedules: true,
			AllowRollup:       true,
		})
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			stream, err = js.Stream(ctx, name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: dispatch stream %q of service %q: %w", ErrUnavailable, name, service,
			dispatchRefusedOr(js.Conn(), err, "STREAM.INFO."+name, "STREAM.CREATE."+name))
	}
	if got := stream.CachedInfo().Config; got.Retention != jetstream.WorkQueuePolicy || !got.AllowMsgSchedules {
		return nil, fmt.Errorf("%w: dispatch stream %q is not a work-queue stream with message schedules allowed", ErrConflict, name)
	}
	return &natsDispatcher{
		js:      js,
		stream:  stream,
		service: service,
		prefix:  base,
		timers:  make(map[*time.Timer]struct{}),
		closed:  make(chan struct{}),
	}, nil
}

// consume makes (or updates) the service's consumers: a delivered
// message comes back after claimTTL and a second (at least
// dispatchAckWaitMin) unless it is ended or marked running. A worker that
// dies holding one is thus replaced once its claim could have expired;
// the clients of a service should share their kinds' policies (the last
// client to start sets the consumers' AckWait).
func (d *natsDispatcher) consume(ctx context.Context, claimTTL time.Duration) error {
	cons := make(map[lane]jetstream.Consumer, 2)
	for ln, name := range map[lane]string{laneReady: "workers", laneCheck: "checkers"} {
		c, err := d.stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
			Durable:       name,
			Description:   "jobkeys " + name + " of service " + d.service,
			FilterSubject: d.prefix + string(ln) + ".>",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       max(claimTTL+time.Second, dispatchAckWaitMin),
			MaxAckPending: -1,
			MaxWaiting:    4096,
		})
		if err != nil {
			stream := d.stream.CachedInfo().Config.Name
			return fmt.Errorf("%w: dispatch consumer %q on stream %q: %w", ErrUnavailable, name, stream,
				dispatchRefusedOr(d.js.Conn(), err, "CONSUMER.CREATE."+stream+"."+name))
		}
		cons[ln] = c
	}
	d.cons = cons
	return nil
}

func (d *natsDispatcher) subject(ln lane, typ string) string {
	return d.prefix + string(ln) + "." + typ
}

func (d *natsDispatcher) announce(ctx context.Context, ln lane, typ string, ref jobRef, at time.Time, id string) error {
	delay := time.Until(at)
	if delay >= dispatchScheduleMin || (ln == laneCheck && delay > 0) {
		return d.schedule(ctx, ln, typ, ref, at)
	}
	if delay > 0 {
		d.mu.Lock()
		select {
		case <-d.closed:
			d.mu.Unlock()
			return nil
		default:
		}
		var t *time.Timer
		t = time.AfterFunc(delay, func() {
			d.mu.Lock()
			_, live := d.timers[t]
			delete(d.timers, t)
			d.mu.Unlock()
			if !live {
				return
			}
			pctx, cancel := context.WithTimeout(context.Background(), d.js.Options().DefaultTimeout)
			defer cancel()
			_ = d.publish(pctx, ln, typ, ref, id) // lost: reconciliation finds the due job
		})
		d.timers[t] = struct{}{}
		d.mu.Unlock()
		return nil
	}
	return d.publish(ctx, ln, typ, ref, id)
}

// schedule publishes the schedule of ref's announcement in lane at at:
// one schedule per job and lane, which a newer one replaces (a requeue
// after a resume, say).
func (d *natsDispatcher) schedule(ctx context.Context, ln lane, typ string, ref jobRef, at time.Time) error {
	due := "due."
	if ln == laneCheck {
		due = "due-check."
	}
	msg := nats.NewMsg(d.prefix + due + escapeToken(ref.channel) + "." + escapeToken(ref.id))
	msg.Data = encodeAnnouncement(ref)
	return d.publishMsg(ctx, msg, "", jetstream.WithScheduleAt(at.UTC().Truncate(time.Second).Add(time.Second)), jetstream.WithScheduleTarget(d.subject(ln, typ)))
}

func (d *natsDispatcher) publish(ctx context.Context, ln lane, typ string, ref jobRef, id string) error {
	msg := nats.NewMsg(d.subject(ln, typ))
	msg.Data = encodeAnnouncement(ref)
	return d.publishMsg(ctx, msg, id)
}

// dispatchPublishAttempts is how many times an announcement is published
// while the server does not answer.
const dispatchPublishAttempts = 4

// publishMsg publishes msg under message id id (a new one when empty),
// again under the same id while the server does not answer — a stream
// leader election, a reconnect — up to dispatchPublishAttempts times and
// while ctx allows: the stream drops a duplicate within its window
// (dispatchDuplicates), so an answer lost after the write adds nothing.
// An announcement that is not published waits for reconciliation or for
// a redelivery, so it is worth a few tries.
func (d *natsDispatcher) publishMsg(ctx context.Context, msg *nats.Msg, id string, opts ...jetstream.PublishOpt) error {
	if id == "" {
		id = NewID()
	}
	opts = append(opts, jetstream.WithMsgID(id))
	pause := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		_, err := d.js.PublishMsg(ctx, msg, opts...)
		if err == nil {
			return nil
		}
		err = dispatchRefusedOr(d.js.Conn(), err, d.prefix)
		if attempt == dispatchPublishAttempts || ctx.Err() != nil || errors.Is(err, jobkeys.ErrPermission) || !dispatchNoAnswer(err) {
			return err
		}
		if !sleepCtx(ctx, d.closed, pause) {
			return err
		}
		pause *= 2
	}
}

// dispatchNoAnswer reports a publish the server did not answer, which may
// or may not have been written.
func dispatchNoAnswer(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse)
}

func (d *natsDispatcher) next(ctx context.Context, ln lane) (delivery, error) {
	cons := d.cons[ln]
	if cons == nil {
		return nil, errors.New("jobs: dispatcher opened without a consumer")
	}
	for {
		select {
		case <-d.closed:
			return nil, errDispatchClosed
		default:
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		fctx, cancel := context.WithTimeout(ctx, dispatchFetchWait)
		m, err := d.fetchOne(fctx, cons, ln)
		cancel()
		if m != nil {
			return m, nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, jobkeys.ErrPermission) {
				return nil, err // for the caller to log: pulling again waits as long
			}
			// The server or the connection is away: pull again shortly.
			if !sleepCtx(ctx, d.closed, 100*time.Millisecond) {
				return nil, errors.Join(ctx.Err(), errDispatchClosed)
			}
		}
	}
}

// fetchOne makes one pull request for one message, which ends when ctx
// does. It returns nil and no error when the request ended empty, or its
// message was no announcement (which it terminates: nobody can use it);
// an error wrapping jobkeys.ErrPermission when it ended empty while the
// connection reports that the server refused the pull request.
func (d *natsDispatcher) fetchOne(ctx context.Context, cons jetstream.Consumer, ln lane) (delivery, error) {
	batch, err := cons.Fetch(1, jetstream.FetchContext(ctx))
	if err != nil {
		return nil, err
	}
	if m, ok := <-batch.Messages(); ok {
		typ, ok := strings.CutPrefix(m.Subject(), d.prefix+string(ln)+".")
		ref, err := decodeAnnouncement(m.Data())
		if !ok || err != nil || typ == "" || strings.Contains(typ, ".") {
			_ = m.Term()
			return nil, nil
		}
		return &natsDelivery{d: d, ln: ln, m: m, typ: typ, ref: ref}, nil
	}
	if err := batch.Error(); err != nil && ctx.Err() == nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
		return nil, err
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		// The request waited all its time: a refused one does too.
		ci := cons.CachedInfo()
		if err := dispatchRefusedOr(d.js.Conn(), ctx.Err(), "CONSUMER.MSG.NEXT."+ci.Stream+"."+ci.Name); errors.Is(err, jobkeys.ErrPermission) {
			return nil, fmt.Errorf("jobs: pull from dispatch consumer %q on stream %q: %w", ci.Name, ci.Stream, err)
		}
	}
	return nil, nil
}

// dispatchRefusedOr returns err of a dispatch request that timed out, or
// (when the connection nc last reported that the server refused one of
// the subjects used, or the connection's inbox) an error wrapping it and
// jobkeys.ErrPermission that names the refused subject: a refusal shows
// only on the connection's async error handler, and the refused request
// itself times out. Any other err is returned unchanged.
func dispatchRefusedOr(nc *nats.Conn, err error, used ...string) error {
	refused, subject, ok := natsRefusal(nc, err, used)
	if !ok {
		return err
	}
	return fmt.Errorf("%w: the NATS server refused %s %q for this connection's user (grant it, or see the connection's async errors): %w",
		jobkeys.ErrPermission, strings.ToLower(refused), subject, err)
}

// sleepCtx waits d unless ctx ends or closed closes first, and reports
// whether it waited all of d.
func sleepCtx(ctx context.Context, closed <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-closed:
	}
	return false
}

func (d *natsDispatcher) close() {
	d.once.Do(func() {
		d.mu.Lock()
		close(d.closed)
		for t := range d.timers {
			t.Stop()
		}
		clear(d.timers)
		d.mu.Unlock()
	})
}

type natsDelivery struct {
	d   *natsDispatcher
	ln  lane
	m   jetstream.Msg
	typ string
	ref jobRef
}

func (n *natsDelivery) jobType() string { return n.typ }
func (n *natsDelivery) job() jobRef     { return n.ref }

// done acknowledges the message. A lost acknowledgement redelivers it
// after AckWait, which costs its worker a read.
func (n *natsDelivery) done() { _ = n.m.Ack() }

// later hands the message back for delay: at once, or within the server's
// redelivery for a short delay; from dispatchScheduleMin on it becomes the
// job's schedule in its lane (replacing the one there) and the message is
// acknowledged, so that no worker holds it meanwhile (a worker holds an
// unacknowledged message, and the stream keeps it, until it ends).
func (n *natsDelivery) later(delay time.Duration) {
	switch {
	case delay <= 0:
		_ = n.m.Nak()
		return
	case delay >= dispatchScheduleMin:
		ctx, cancel := context.WithTimeout(context.Background(), n.d.js.Options().DefaultTimeout)
		defer cancel()
		if n.d.schedule(ctx, n.ln, n.typ, n.ref, time.Now().Add(delay)) == nil {
			_ = n.m.Ack()
			return
		}
	}
	_ = n.m.NakWithDelay(delay)
}

func (n *natsDelivery) running() { _ = n.m.InProgress() }
