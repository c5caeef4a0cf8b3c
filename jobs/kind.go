package jobs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jobkeys/jobkeys"
)

// ErrUnknownKind reports an enqueue of a type no kind is registered for.
var ErrUnknownKind = errors.New("jobs: no kind registered for job type")

// Kind is a kind of job: its type, the version of its input, the key
// policy its jobs run under, its failure budget and timeout, and its
// handler. In and Out are the handler's input and result, carried as JSON
// in the job's Input and in the artifact a success settles.
type Kind[In, Out any] struct {
	// Type is the job type: the store's Job.Type and the key layer's job
	// type, so it must be a valid key-layer job type. Required.
	Type string
	// Version is the input version this handler reads; a job enqueued with
	// another version is handed back for UnknownKindDelay. Defaults to 1.
	Version int
	// Policy is the key policy (key template, MaxActive, queue limit,
	// WhenFull, heartbeat interval and TTL). The claim is renewed with the
	// slot every HeartbeatInterval; claims last the longest HeartbeatTTL
	// of the client's kinds (one claim call serves every kind).
	Policy jobkeys.Policy
	// MaxFailures is the failure budget: the attempt that makes Failures
	// reach it fails the job for good. Defaults to MaxFailuresDefault (5).
	MaxFailures int
	// Timeout bounds one attempt; passing it counts as a failure. Zero:
	// none.
	Timeout time.Duration
	// Work runs one attempt. Its error requeues the job with backoff,
	// counting a failure; a nil error settles the job with out as its
	// artifact (a result the store refuses — over ArtifactSizeLimit, or
	// a record over the server's max_payload — is a failure too). An
	// error marked [Permanent] fails the job at once; a [Snooze] hands
	// it back for a while without counting a failure. ctx ends, with a
	// cause saying why (see [ErrClaimLost] and the errors beside it),
	// when the attempt must stop, at the latest at the claim's local
	// deadline: check ctx.Err() right before an external effect, and
	// hand the systems written to run.Job().ClaimGeneration as a fencing
	// token (see [Run.Job]). Nil registers the kind to enqueue only: a
	// producer enqueues its jobs (under its policy) and never runs them,
	// and [Client.Start] refuses a client with such a kind.
	Work func(ctx context.Context, run *Run, in In) (out Out, err error)
}

// kind is a registered Kind without its type parameters.
type kind struct {
	typ         string
	version     int
	jt          *jobkeys.JobType
	maxFailures int
	timeout     time.Duration
	// work runs an attempt; nil for a kind registered to enqueue only.
	work func(ctx context.Context, run *Run, input json.RawMessage) (json.RawMessage, error)
	// decode checks that input decodes into the kind's In, as work
	// decodes it; Client.Enqueue refuses an input it cannot.
	decode func(input json.RawMessage) error
}

// Register adds kind k to client c. It must be called before
// [Client.Start]; a type registered twice or a bad policy or name is an
// error. A kind without Work can be registered by a producer, which
// enqueues its jobs and runs none (see [Kind.Work]).
func Register[In, Out any](c *Client, k Kind[In, Out]) error {
	if c == nil || c.coord == nil {
		return fmt.Errorf("jobs: register kind %q: the client is nil or was not made by NewClient", k.Type)
	}
	if k.Version == 0 {
		k.Version = 1
	}
	if k.Version < 0 {
		return fmt.Errorf("jobs: register kind %q: Version %d is negative", k.Type, k.Version)
	}
	switch {
	case k.MaxFailures == 0:
		k.MaxFailures = MaxFailuresDefault
	case k.MaxFailures < 0:
		return fmt.Errorf("jobs: register kind %q: MaxFailures %d is negative", k.Type, k.MaxFailures)
	}
	if k.Timeout < 0 {
		return fmt.Errorf("jobs: register kind %q: Timeout %v is negative", k.Type, k.Timeout)
	}
	jt, err := c.coord.JobType(c.cfg.Service, k.Type, k.Policy)
	if err != nil {
		return fmt.Errorf("jobs: register kind %q: %w", k.Type, err)
	}
	rk := &kind{
		typ: k.Type, version: k.Version, jt: jt, maxFailures: k.MaxFailures, timeout: k.Timeout,
		decode: func(input json.RawMessage) error {
			var in In
			if len(input) == 0 {
				return nil
			}
			return json.Unmarshal(input, &in)
		},
	}
	if work := k.Work; work != nil {
		rk.work = func(ctx context.Context, run *Run, input json.RawMessage) (json.RawMessage, error) {
			var in In
			if len(input) > 0 {
				if err := json.Unmarshal(input, &in); err != nil {
					return nil, fmt.Errorf("jobs: decode input of job %q: %w", run.claim.JobID, err)
				}
			}
			out, err := work(ctx, run, in)
			if err != nil {
				return nil, err
			}
			b, err := json.Marshal(out)
			if err != nil {
				return nil, fmt.Errorf("jobs: encode result of job %q: %w", run.claim.JobID, err)
			}
			return b, nil
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.state != clientNew {
		return fmt.Errorf("jobs: register kind %q: the client has started", k.Type)
	}
	if _, dup := c.kinds[k.Type]; dup {
		return fmt.Errorf("jobs: register kind %q: already registered", k.Type)
	}
	c.kinds[k.Type] = rk
	return nil
}

// derives reports whether input derives a key under k's policy.
func (k *kind) derives(input json.RawMessage) bool {
	_, err := k.jt.Key([]byte(inputOf(Job{Input: input})))
	return err == nil
}

// kindOf returns the kind registered for typ.
func (c *Client) kindOf(typ string) (*kind, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := c.kinds[typ]
	if k == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownKind, typ)
	}
	return k, nil
}

// producerOnly is the error of Start for a client with kinds registered
// without Work (to enqueue only), naming them; nil when there is none.
// c.mu must be held.
func (c *Client) producerOnly() error {
	var types []string
	for typ, k := range c.kinds {
		if k.work == nil {
			types = append(types, strconv.Quote(typ))
		}
	}
	if len(types) == 0 {
		return nil
	}
	slices.Sort(types)
	return fmt.Errorf("jobs: Start: kind %s has no Work (registered to enqueue only): a client that runs jobs needs a Work for every kind it registers; enqueue from a client that is not started", strings.Join(types, ", "))
}
