package jobkeys

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"weak"

	"github.com/jobkeys/jobkeys/internal/natsperm"
	"github.com/nats-io/nats.go"
)

// A NATS server refuses a publish or subscription the user may not make by
// sending the client an error, which nats.go hands only to the connection's
// async error handler; the refused request itself would just time out. The
// first NATSStore on a connection therefore puts a handler in front of the
// connection's (see connectionGuards), and every call of a store on it
// registers a guard while it runs: a refusal of a subject the call needs
// cancels the call at once, and the call returns an error wrapping
// ErrPermission that names the subject.

// permissionViolation is one refusal the server reported.
type permissionViolation struct {
	what       string // "publish to", "subscription to" or "publish with reply of"
	subject    string
	reconnects uint64 // the connection's reconnects when it was reported
}

// Error implements error; it is the cause a guard's context is cancelled with.
func (v *permissionViolation) Error() string {
	return fmt.Sprintf("the NATS server refused %s %q for this connection's user", v.what, v.subject)
}

// parseViolation returns the violation err reports, or nil.
func parseViolation(nc *nats.Conn, err error) *permissionViolation {
	pv, ok := natsperm.Parse(err)
	if !ok {
		return nil
	}
	v := &permissionViolation{what: strings.ToLower(pv.What), subject: pv.Subject}
	if nc != nil {
		v.reconnects = nc.Stats().Reconnects
	}
	return v
}

// natsOpKind says which subjects a store call needs, for matching refusals.
type natsOpKind uint8

const (
	natsOpRead  natsOpKind = 1 << iota // direct get or leader message get
	natsOpWrite                        // a publish to the key's subject
	natsOpWatch                        // creating and deleting a consumer, flow control
	// Creating a bucket (WithCreateBuckets): the account info request
	// nats.go makes first and the stream's create. Only the guard of the
	// creation itself has it: a refusal fails the creation, at once.
	natsOpCreate
	// Allowing atomic publish on a created bucket's stream (a stream
	// update). Only the guard of that update has it: a refusal ends the
	// update at once and the bucket goes on without batches.
	natsOpUpdateStream
)

// needs reports whether a call of kind on service's bucket (name bucket)
// uses subject, a subject the server refused. Opening the bucket (stream
// info) and the connection's inbox concern every call. api is the prefix
// of the call's JetStream API subjects, ending in "." (see
// jscas.APIPrefix), where the call needs account info (natsOpCreate).
func needs(kind natsOpKind, bucket, inbox, api, subject string) bool {
	if strings.HasPrefix(subject, inbox) {
		return true // request replies and watch deliveries
	}
	stream := "KV_" + bucket
	ofStream := false // an API or flow control subject of the bucket's stream
	for tok := range strings.SplitSeq(subject, ".") {
		if tok == stream {
			ofStream = true
			break
		}
	}
	if !ofStream {
		if kind&natsOpCreate != 0 && api != "" && subject == api+"INFO" {
			return true // account info: "$JS.API.INFO", "$JS.<domain>.API.INFO", "<API prefix>.INFO"
		}
		// A key subject, also behind an API prefix: "<prefix>.$KV.<bucket>.<key>".
		return kind&natsOpWrite != 0 && strings.Contains(subject, "$KV."+bucket+".")
	}
	switch {
	case strings.Contains(subject, ".STREAM.INFO."):
		return true
	case strings.Contains(subject, ".STREAM.CREATE."):
		return kind&natsOpCreate != 0
	case strings.Contains(subject, ".STREAM.UPDATE."):
		return kind&natsOpUpdateStream != 0
	case strings.Contains(subject, ".DIRECT.GET.") || strings.Contains(subject, ".STREAM.MSG.GET."):
		return kind&natsOpRead != 0
	case strings.Contains(subject, ".CONSUMER.") || strings.HasPrefix(subject, "$JS.FC."):
		return kind&natsOpWatch != 0
	}
	return false
}

// inboxPrefix returns the prefix, ending in ".", of nc's inbox subjects.
func inboxPrefix(nc *nats.Conn) string { return natsperm.InboxPrefix(nc) }

// permissionGuards are the guards of the running calls of the stores on one
// connection. The zero value is ready; its methods are safe for concurrent
// use.
type permissionGuards struct {
	mu     sync.Mutex
	active map[*permissionGuard]struct{}
	// inbox is the last refused subscription to the connection's inbox,
	// or nil. Request replies arrive on one inbox subscription nats.go
	// makes once, so that refusal fails every later request too, until
	// the client reconnects and subscribes again; the server does not
	// report it again.
	inbox atomic.Pointer[permissionViolation]
	// wakes counts the refusals of the stores' wake-up subjects
	// (natskv_wake.go), which concern no call.
	wakes wakeRefusals
}

// permissionGuard cancels one call's context when the server refuses a
// subject the call needs.
type permissionGuard struct {
	guards  *permissionGuards
	kind    natsOpKind
	prefix  string // the store's bucket prefix
	service string
	api     string // the prefix of the call's API subjects, for natsOpCreate; see needs
	cancel  context.CancelCauseFunc
}

// guard registers a call of kind on the bucket of service (under bucket
// prefix prefix) and returns the context it must use; release ends the
// registration (and does not cancel the context).
func (g *permissionGuards) guard(ctx context.Context, kind natsOpKind, prefix, service string) (context.Context, *permissionGuard) {
	return g.guardAPI(ctx, kind, prefix, service, "")
}

// guardAPI is guard for a call whose JetStream API subjects start with
// api (see needs).
func (g *permissionGuards) guardAPI(ctx context.Context, kind natsOpKind, prefix, service, api string) (context.Context, *permissionGuard) {
	gctx, cancel := context.WithCancelCause(ctx)
	pg := &permissionGuard{guards: g, kind: kind, prefix: prefix, service: service, api: api, cancel: cancel}
	g.mu.Lock()
	if g.active == nil {
		g.active = make(map[*permissionGuard]struct{})
	}
	g.active[pg] = struct{}{}
	g.mu.Unlock()
	return gctx, pg
}

// release unregisters the guard; the context stays as it is.
func (pg *permissionGuard) release() {
	pg.guards.mu.Lock()
	delete(pg.guards.active, pg)
	pg.guards.mu.Unlock()
}

// done releases the guard and cancels its context.
func (pg *permissionGuard) done() {
	pg.release()
	pg.cancel(nil)
}

// record is called with every error reported on the connection: a refusal
// cancels the running calls that need the refused subject.
func (g *permissionGuards) record(nc *nats.Conn, err error) {
	v := parseViolation(nc, err)
	if v == nil || g.wakes.take(v) {
		return
	}
	inbox := inboxPrefix(nc)
	if v.what == "subscription to" && strings.HasPrefix(v.subject, inbox) && strings.HasSuffix(v.subject, ".*") {
		g.inbox.Store(v) // the reply subscription, "<inbox prefix><id>.*"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for pg := range g.active {
		if needs(pg.kind, pg.prefix+"_"+pg.service, inbox, pg.api, v.subject) {
			pg.cancel(v)
		}
	}
}

// refusedInbox returns the refusal of nc's inbox subscription when it still
// holds (no reconnect since), or nil.
func (g *permissionGuards) refusedInbox(nc *nats.Conn) *permissionViolation {
	v := g.inbox.Load()
	if v == nil || nc == nil {
		return nil
	}
	if nc.Stats().Reconnects != v.reconnects {
		g.inbox.CompareAndSwap(v, nil)
		return nil
	}
	return v
}

// explainPermission returns the error of a call that ran under gctx, a guard's
// context derived from the caller's ctx: the refusal that cancelled it as
// an error wrapping ErrPermission, or err itself.
func explainPermission(ctx, gctx context.Context, op, key string, err error) error {
	if err == nil || ctx.Err() != nil {
		return err // the caller's own context ended: its error stands
	}
	var v *permissionViolation
	if errors.As(context.Cause(gctx), &v) {
		return fmt.Errorf("%w: %s %s: %v", ErrPermission, op, key, v)
	}
	return err
}

// connGuards maps a connection, weakly, to its permissionGuards, so that
// every store on it shares one handler and a store per request does not
// grow the handler chain; the entry goes when the connection is collected.
var (
	connGuardsMu sync.Mutex
	connGuards   = make(map[weak.Pointer[nats.Conn]]*permissionGuards)
)

// connectionGuards returns nc's guards, on first use putting a handler in
// front of nc's async error handler that hands every error to them and then
// calls the handler it replaced, if any. A handler set on nc later
// replaces this one; refused requests then fail as the timeouts they are.
func connectionGuards(nc *nats.Conn) *permissionGuards {
	if nc == nil {
		return &permissionGuards{}
	}
	key := weak.Make(nc)
	connGuardsMu.Lock()
	defer connGuardsMu.Unlock()
	if g := connGuards[key]; g != nil {
		return g
	}
	g := &permissionGuards{}
	next := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		g.record(c, err)
		if next != nil {
			next(c, sub, err)
		}
	})
	connGuards[key] = g
	runtime.AddCleanup(nc, func(k weak.Pointer[nats.Conn]) {
		connGuardsMu.Lock()
		delete(connGuards, k)
		connGuardsMu.Unlock()
	}, key)
	return g
}
