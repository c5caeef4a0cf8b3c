// Package natsperm reads the NATS server's permission refusals, for both
// of jobkeys' NATS stores: a publish or subscription the user may not
// make is reported to the client as an error message (`Permissions
// Violation for Publish to "<subject>"`, `… for Subscription to …`,
// `… for Publish with Reply of …`), which nats.go hands only to the
// connection's async error handler and keeps as its last error; the
// refused request itself just times out. [Parse] turns that error into a
// [Violation] naming the subject, and [InboxPrefix] gives the prefix of
// the connection's inboxes, where every reply arrives, so that a store
// can tell a refusal of one of its calls' subjects (or of its replies)
// from another's.
//
// It is not in nats.go because nats.go exposes the refusal only as that
// message text (nats.ErrPermissionViolation with the server's words),
// and its inbox prefix rule only inside its own request code. The root
// package (which cancels a call at the refusal, through its guards) and
// package jobs (which names the refusal behind a timeout) use this one
// parser; each wraps the result in its own errors.
package natsperm
