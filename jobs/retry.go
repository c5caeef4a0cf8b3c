package jobs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
)

// RetryOriginPrefix begins the Origin of a job [Client.Retry] made; the
// rest names the job it runs again (see retryOf).
const RetryOriginPrefix = "retry:"

// Retry runs job jobID of channelID — failed, cancelled or superseded —
// again, as a new job of the same type, version, input and target, and
// returns it. The old job is left as it is; the new one's Origin is
// RetryOriginPrefix and the old job's id (a SHA-256 of it when that would
// pass IdentifierSizeLimit), and so is its idempotency key: a second
// Retry of the same job makes nothing and returns the job the first made,
// as it is now (to run the work once more, retry that one). Its id is a
// new [NewID].
//
// The new job goes through [Client.Enqueue]'s rules: it is the target's
// newest job, so it supersedes an active job of the target (reported by
// nothing here: the target of a superseded job may have a newer one, and
// Get of the returned job's target says so), and its key's policy admits
// it: when its key coalesces it, Retry returns the existing job it folded
// into; a rejection is a [*RejectedError]. In a client without a kind for
// the job's type (an operator's tool) the record is written and the
// admission left to a client that has the kind: its checker admits the
// job, strictly, AdmitGrace after its creation (see Dispatch in the
// package doc).
//
// A job in another state is an error wrapping [ErrConflict] that says
// which; a missing job or channel is the store's [ErrNotFound].
func (c *Client) Retry(ctx context.Context, channelID, jobID string) (Job, error) {
	d, err := c.store.Get(ctx, channelID, jobID)
	if err != nil {
		return Job{}, err
	}
	old := d.Job
	switch old.State {
	case StateFailed, StateCancelled, StateSuperseded:
	default:
		return Job{}, conflictf("retry job %q of channel %q: it is %s; only a failed, cancelled or superseded job runs again", jobID, channelID, old.State)
	}
	ref := retryOf(old.ID)
	req := EnqueueRequest{
		ID: NewID(), ChannelID: old.ChannelID, Type: old.Type, Version: old.Version,
		Origin: ref, TargetKey: old.TargetKey, IdempotencyKey: ref,
		Fingerprint: Fingerprint(old.Type, old.Version, old.Input), Input: old.Input,
	}
	k, err := c.kindOf(old.Type)
	if errors.Is(err, ErrUnknownKind) {
		enq, err := c.write(ctx, req)
		if err != nil {
			return Job{}, err
		}
		if !enq.Repeated {
			c.notifyTarget(enq.Job)
		}
		return enq.Job, nil
	}
	if err != nil {
		return Job{}, err
	}
	res, err := c.enqueue(ctx, k, req)
	if err != nil {
		return Job{}, err
	}
	return res.Job, nil
}

// retryOf is the Origin and idempotency key of the retry of job id:
// RetryOriginPrefix and id, or, when that is over IdentifierSizeLimit
// bytes, RetryOriginPrefix, "sha256:" and the hex SHA-256 of id.
func retryOf(id string) string {
	if len(RetryOriginPrefix)+len(id) <= IdentifierSizeLimit {
		return RetryOriginPrefix + id
	}
	sum := sha256.Sum256([]byte(id))
	return RetryOriginPrefix + "sha256:" + hex.EncodeToString(sum[:])
}
