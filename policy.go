package jobkeys

import (
	"fmt"
	"time"
)

// StalePolicy says what happens to a slot whose lease has expired because its
// holder stopped renewing it.
type StalePolicy string

const (
	// FailStale drops expired slots when another job acquires, and reports
	// them in [Acquisition.Stale] so the caller can record those jobs as failed.
	FailStale StalePolicy = "fail-stale"
	// Block keeps expired slots; while any is expired and the key is at
	// capacity, acquisition is blocked with [ReasonStaleBlocked].
	Block StalePolicy = "block"
)

// WhenFull says what a non-strict admission does when a key's queue is full.
type WhenFull string

const (
	// Reject rejects the new job.
	Reject WhenFull = "reject"
	// Coalesce reports the oldest queued job (or, with none queued, the
	// oldest active job) as the one the new job folds into.
	Coalesce WhenFull = "coalesce"
	// ReplaceOldest drops the oldest queued job, reports it, and queues the
	// new job.
	ReplaceOldest WhenFull = "replace-oldest"
)

// Policy defaults, filled in by [Policy.Normalize] for zero-valued fields.
const (
	MaxActiveDefault         = 1
	HeartbeatIntervalDefault = 30 * time.Second
	HeartbeatTTLDefault      = 120 * time.Second
	StalePolicyDefault       = FailStale
	MaxQueuedPerKeyDefault   = 0
	WhenFullDefault          = Reject
)

// Policy limits: larger values cannot be written into key state (its
// numbers must be exact as IEEE doubles, 2^53-1 at most) or would push
// lease expiries far out.
const (
	MaxActiveLimit       int64 = 1<<53 - 1
	MaxQueuedPerKeyLimit int64 = 1<<53 - 1
	HeartbeatTTLLimit          = 365 * 24 * time.Hour
)

// Policy is the keyed concurrency policy of one job type. The zero value of
// every field but Key means its default; call [Policy.Normalize] to fill the
// defaults and validate. A Policy is a plain value and safe to share.
//
// # Clocks
//
// Leases are timestamps written by the host that acquired or renewed them
// and compared against the clock of whichever host looks next. Mutual
// exclusion (never more than MaxActive live slots) therefore holds only
// while the clocks of all hosts sharing a bucket differ by less than
// HeartbeatTTL − HeartbeatInterval: a host whose clock runs that far ahead
// sees a lease as expired while its holder still renews it, and takes the
// slot over. Keep hosts on NTP and leave HeartbeatTTL a wide margin over
// HeartbeatInterval (the defaults leave 90s). A coordinator over a
// [NATSStore] checks its own clock against the NATS server's and refuses
// to acquire or sweep while it is half that margin away or more (see
// [ErrClockSkew]).
type Policy struct {
	// Key is the key template: each segment is either a literal (not
	// starting with "/") or an RFC 6901 JSON pointer into the job payload
	// (starting with "/"). At least one segment is required and no segment
	// may be empty.
	Key []string

	// MaxActive is the most jobs per key that may hold a slot at once.
	// Defaults to MaxActiveDefault (1).
	MaxActive int

	// HeartbeatInterval is how often a running job renews its lease. It is
	// at least 1ms. Defaults to HeartbeatIntervalDefault (30s).
	HeartbeatInterval time.Duration

	// HeartbeatTTL is how long a lease lasts after its last renewal; it must
	// exceed HeartbeatInterval and may not exceed HeartbeatTTLLimit.
	// HeartbeatTTL − HeartbeatInterval is the clock skew between hosts the
	// leases tolerate (see Clocks in the type's doc), and the time a failed renewal
	// has to be retried before the slot may be taken over. Defaults to
	// HeartbeatTTLDefault (120s).
	HeartbeatTTL time.Duration

	// StalePolicy says what happens to expired slots. Defaults to
	// StalePolicyDefault (FailStale).
	StalePolicy StalePolicy

	// MaxQueuedPerKey is how many jobs may wait per key beyond the free
	// slots. Defaults to MaxQueuedPerKeyDefault (0).
	MaxQueuedPerKey int

	// WhenFull says what a non-strict admission does when the queue is
	// full. Defaults to WhenFullDefault (Reject).
	WhenFull WhenFull
}

// Normalize returns p with defaults filled in for zero-valued fields, or an
// error wrapping [ErrInvalidPolicy] that names the first bad field.
// It does not modify p; the returned Key slice is a copy.
func (p Policy) Normalize() (Policy, error) {
	if len(p.Key) == 0 {
		return Policy{}, policyError("Key", "the key template is empty")
	}
	for i, seg := range p.Key {
		if seg == "" {
			return Policy{}, policyError("Key", fmt.Sprintf("segment %d is empty", i))
		}
		if seg[0] == '/' {
			if err := checkPointer(seg); err != nil {
				// err wraps ErrInvalidPolicy and names the pointer.
				return Policy{}, fmt.Errorf("%w (field Key, segment %d)", err, i)
			}
		}
	}
	p.Key = append([]string(nil), p.Key...)

	switch {
	case p.MaxActive == 0:
		p.MaxActive = MaxActiveDefault
	case p.MaxActive < 1:
		return Policy{}, policyError("MaxActive", fmt.Sprintf("%d is less than 1", p.MaxActive))
	case int64(p.MaxActive) > MaxActiveLimit:
		return Policy{}, policyError("MaxActive", fmt.Sprintf("%d exceeds MaxActiveLimit (2^53-1)", p.MaxActive))
	}
	switch {
	case p.HeartbeatInterval == 0:
		p.HeartbeatInterval = HeartbeatIntervalDefault
	case p.HeartbeatInterval < time.Millisecond:
		return Policy{}, policyError("HeartbeatInterval", fmt.Sprintf("%v is less than 1ms", p.HeartbeatInterval))
	}
	switch {
	case p.HeartbeatTTL == 0:
		p.HeartbeatTTL = HeartbeatTTLDefault
	case p.HeartbeatTTL < time.Millisecond:
		return Policy{}, policyError("HeartbeatTTL", fmt.Sprintf("%v is less than 1ms", p.HeartbeatTTL))
	case p.HeartbeatTTL > HeartbeatTTLLimit:
		return Policy{}, policyError("HeartbeatTTL", fmt.Sprintf("%v exceeds HeartbeatTTLLimit %v", p.HeartbeatTTL, HeartbeatTTLLimit))
	}
	if p.HeartbeatTTL <= p.HeartbeatInterval {
		return Policy{}, policyError("HeartbeatTTL", fmt.Sprintf("%v does not exceed HeartbeatInterval %v", p.HeartbeatTTL, p.HeartbeatInterval))
	}
	switch p.StalePolicy {
	case "":
		p.StalePolicy = StalePolicyDefault
	case FailStale, Block:
	default:
		return Policy{}, policyError("StalePolicy", fmt.Sprintf("unknown value %q (want %q or %q)", p.StalePolicy, FailStale, Block))
	}
	if p.MaxQueuedPerKey < 0 {
		return Policy{}, policyError("MaxQueuedPerKey", fmt.Sprintf("%d is negative", p.MaxQueuedPerKey))
	}
	if int64(p.MaxQueuedPerKey) > MaxQueuedPerKeyLimit {
		return Policy{}, policyError("MaxQueuedPerKey", fmt.Sprintf("%d exceeds MaxQueuedPerKeyLimit (2^53-1)", p.MaxQueuedPerKey))
	}
	switch p.WhenFull {
	case "":
		p.WhenFull = WhenFullDefault
	case Reject, Coalesce, ReplaceOldest:
	default:
		return Policy{}, policyError("WhenFull", fmt.Sprintf("unknown value %q (want %q, %q or %q)", p.WhenFull, Reject, Coalesce, ReplaceOldest))
	}
	return p, nil
}

func policyError(field, reason string) error {
	return fmt.Errorf("%w: field %s: %s", ErrInvalidPolicy, field, reason)
}
