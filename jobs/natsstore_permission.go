package jobs

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/internal/natsperm"
	"github.com/nats-io/nats.go"
)

// A NATS server refuses a publish or subscription the user may not make by
// telling the connection's async error handler only (nats.go keeps it as
// the connection's last error, until a reconnect); the refused request
// itself times out. A store call that times out while the connection's
// last error is a refusal of one of the subjects that call uses (or of the
// connection's inbox, which every reply needs) fails naming that refusal
// (jobkeys.ErrPermission), not as a bare timeout. A refusal of another
// call's subject, even an older one of this store's, is not this call's
// cause.

// unavailable is natsUnavailable for a call of s that published to the
// subjects used (each a subject or the start of one: a refused subject
// that contains it is the call's): a timeout behind which the connection
// reports a refusal of one of them, or of the inbox, wraps
// jobkeys.ErrPermission too, and names the subject. The timeout is the
// store's own (the error wraps ErrUnavailable) or the caller's deadline
// (it wraps ctx.Err()); a cancelled ctx's error is returned unchanged.
func (s *NATSStore) unavailable(ctx context.Context, op, what string, err error, used ...string) error {
	return natsRefusedOr(ctx, s.js.Conn(), op, what, err, used)
}

// natsRefusedOr is NATSStore.unavailable for a call on nc.
func natsRefusedOr(ctx context.Context, nc *nats.Conn, op, what string, err error, used []string) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		return ctx.Err()
	}
	if refused, subject, ok := natsRefusal(nc, err, used); ok {
		// The timeout is the caller's deadline (its error) or the store's
		// own (ErrUnavailable, not matching context.DeadlineExceeded).
		var base error = ErrUnavailable
		if ctx.Err() != nil {
			base = ctx.Err()
		}
		return fmt.Errorf("%w: %w: %s: %s: the NATS server refused %s %q for this connection's user (grant it, or see the connection's async errors): %v",
			base, jobkeys.ErrPermission, op, what, strings.ToLower(refused), subject, err)
	}
	return natsUnavailable(ctx, op, what, err)
}

// natsRefusal returns the refusal nc last reported when err is a
// timeout and the refused subject is the connection's inbox, which carries
// every reply, or one of the subjects used by the call that timed out (a
// refused subject containing one of them).
func natsRefusal(nc *nats.Conn, err error, used []string) (what, subject string, ok bool) {
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
		return "", "", false
	}
	v, ok := natsperm.Parse(nc.LastError())
	if !ok {
		return "", "", false
	}
	subject = v.Subject
	ours := strings.HasPrefix(subject, natsperm.InboxPrefix(nc))
	for _, u := range used {
		ours = ours || u != "" && strings.Contains(subject, u)
	}
	if !ours {
		return "", "", false
	}
	return v.What, subject, true
}
