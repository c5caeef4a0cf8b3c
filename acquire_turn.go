package jobkeys

import "context"

// WithQueueTurn makes an acquisition of a queued job keep the queue's
// order over targeted wake-ups (a store made with [WithWakeUps]), as a
// [Runner]'s first try and its try right after subscribing do: when the
// key has slots free but the job is queued behind at least as many jobs
// as there are free slots, and not all of those wait for their wake-ups
// in this coordinator's store, the acquisition writes nothing and is
// blocked (KindBlocked, ReasonActiveLimit, with Active below Limit: the
// slots are free, for the jobs ahead), rather than take a slot a wake-up
// is on its way for to a job ahead of it, which the reducer allows. It
// then sends the jobs ahead the wake-up of that state itself, with the job
// as the last target: a job ahead that waits is woken (again), those
// nobody waits for are passed over, down to the job, whose subscription
// of [Watcher.SubscribeJob] in this store it wakes.
//
// For a worker runtime of its own that waits as a Runner does
// ([Watcher.SubscribeJob]): pass it on a job's first try and on its try
// right after subscribing, not on the tries a wake-up, a recheck or a
// lease's expiry starts (those are its turn); and, blocked so, try again
// within a second or so if no wake-up comes (the jobs ahead may be slow
// to act on theirs, or lost them). It does nothing for a retry
// ([WithRetry], not queued) or over a store without wake-ups. A [Runner]
// over wake-ups keeps the order without it: passed to [Runner.Run] or
// [Runner.TryRun], it changes only the tries the Runner does not already
// make in turn or on a wake-up: TryRun's, and the first try of a Run
// without a [Watcher] (not its rechecks, which take a slot left free).
func WithQueueTurn() AcquireOption { return queueTurnOption{} }

type queueTurnOption struct{}

func (queueTurnOption) applyAcquire(r AcquireRequest) AcquireRequest { return r }

// queueTurn returns ctx carrying a try in turn (see waitTry.inTurn) when
// opts hold WithQueueTurn, req (with the options applied) is no retry,
// the coordinator has wake-ups and ctx carries no try of a Runner's; else
// ctx and nil.
func (jt *JobType) queueTurn(ctx context.Context, opts []AcquireOption, req AcquireRequest) (context.Context, *waitTry) {
	if req.Retry || jt.coord.wakes == nil || ctx.Value(waitTryKey{}) != nil {
		return ctx, nil
	}
	for _, o := range opts {
		if _, ok := o.(queueTurnOption); ok {
			wt := &waitTry{inTurn: true}
			return withWaitTry(ctx, wt), wt
		}
	}
	return ctx, nil
}

// afterQueueTurn sends, after a try in turn wt (nil: none) of job jobID on
// kvKey that was blocked before its turn, the wake-up of the jobs ahead
// (see wakeAhead).
func (jt *JobType) afterQueueTurn(wt *waitTry, kvKey, jobID string, err error) {
	if wt == nil || err != nil || wt.ahead == 0 {
		return
	}
	jt.coord.wakeAhead(jt.service, kvKey, jt.coord.keys.entry(kvKey), wt.rev, jobID, jt.policy)
}
