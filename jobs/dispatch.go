package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Dispatch is how the runtime hands a worker its next job (see
// docs/design/dispatch.md). Its messages are announcements: "job J of type
// T may start (at time t)". An announcement carries the job's identity and
// nothing else a write is computed from: the worker that takes it reads the
// job record and the key's state from the stores, and the slot (a key
// compare-and-swap) and the claim (a job compare-and-swap, fenced by claim
// generation) decide. A duplicated, stale, lost or forged announcement
// costs at most a wasted read or a delay until reconciliation.
//
// A dispatcher is the queue announcements travel through: a JetStream
// work-queue stream between processes (natsDispatcher), or a queue in
// memory within one (memDispatcher).
type dispatcher interface {
	// announce queues in lane the announcement that job ref of type typ
	// may start at at (zero or past: now). id, when not empty, names the
	// announcement: a second announcement with the same id within the
	// dispatcher's de-duplication window is dropped. A check is kept by
	// the server whatever its delay: it is what a crash leaves behind.
	announce(ctx context.Context, ln lane, typ string, ref jobRef, at time.Time, id string) error
	// next waits for an announcement of lane and hands it to the caller,
	// who must end it (done or later). It returns ctx's error when ctx
	// ends first, and errDispatchClosed once the dispatcher is closed.
	next(ctx context.Context, ln lane) (delivery, error)
	// close ends every next call; announcements queued stay queued (for
	// another process, over NATS).
	close()
}

// delivery is one announcement handed to a worker.
type delivery interface {
	jobType() string
	job() jobRef
	// done ends it: nobody needs to look at it again.
	done()
	// later hands it back, to be delivered again (to any worker) after
	// delay.
	later(delay time.Duration)
	// running says its job runs: a worker that takes an announcement
	// and dies is covered by its redelivery, which running pushes back.
	running()
}

// lane is a dispatcher's queue: the workers take ready announcements; one
// checker per client takes checks, the announcements an Enqueue makes
// before the record in case its producer dies before the admission, which
// must not wait behind, nor delay, the jobs that may start.
type lane string

const (
	laneReady lane = "ready"
	laneCheck lane = "check"
)

// errDispatchClosed is next's error once the dispatcher is closed.
var errDispatchClosed = errors.New("jobs: dispatcher closed")

// announcement is the body of a dispatch message.
type announcement struct {
	Channel string `json:"c"`
	Job     string `json:"j"`
}

func encodeAnnouncement(ref jobRef) []byte {
	b, _ := json.Marshal(announcement{Channel: ref.channel, Job: ref.id}) // two strings: cannot fail
	return b
}

// decodeAnnouncement reads a dispatch message's body. Anything may arrive
// on a dispatch subject (anyone with publish rights on it can send it):
// what does not decode to a job reference is an error, dropped by the
// caller.
func decodeAnnouncement(b []byte) (jobRef, error) {
	var a announcement
	if err := json.Unmarshal(b, &a); err != nil {
		return jobRef{}, fmt.Errorf("dispatch message: %w", err)
	}
	if a.Channel == "" || a.Job == "" {
		return jobRef{}, fmt.Errorf("dispatch message: channel %q or job %q is empty", a.Channel, a.Job)
	}
	if len(a.Channel) > IdentifierSizeLimit || len(a.Job) > IdentifierSizeLimit {
		return jobRef{}, errors.New("dispatch message: an identifier is over IdentifierSizeLimit")
	}
	return jobRef{a.Channel, a.Job}, nil
}
