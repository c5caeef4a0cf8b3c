package jobkeys

// queueTurnOption makes an acquisition of a queued job keep the queue's
// order over targeted wake-ups (a store made with [WithWakeUps]), as a
// [Runner]'s first try and its try right after subscribing do (see
// waitTry.inTurn): when the key has slots free but the job is queued
// behind at least as many jobs as there are free slots, and not all of
// those wait for their wake-ups in this coordinator's store, the
// acquisition writes nothing and is blocked (KindBlocked,
// ReasonActiveLimit, with Active below Limit: the slots are free, for the
// jobs ahead), rather than take a slot a wake-up is on its way for to a
// job ahead of it, which the reducer allows. It then sends the jobs ahead
// the wake-up of that state itself, with the job as the last target (see
// wakeAhead).
//
// It does nothing for a retry ([WithRetry], not queued), over a store
// without wake-ups, or on a try a Runner already makes in turn or on a
// wake-up: passed to [Runner.Run] or [Runner.TryRun], it changes only
// TryRun's try and the first try of a Run without a [Watcher] (not its
// rechecks, which take a slot left free). It was the exported option
// WithQueueTurn of the jobs runtime's own waiting, which the dispatch
// replaced (docs/design/dispatch.md); it stays, unexported, for the
// tests that hold the in-turn rule of the Runner's tries on its own.
type queueTurnOption struct{}

// queueTurn returns the option (see queueTurnOption).
func queueTurn() AcquireOption { return queueTurnOption{} }

func (queueTurnOption) applyAcquire(r AcquireRequest) AcquireRequest { return r }

// queueTurn returns a try in turn (see waitTry.inTurn) when opts hold
// queueTurnOption, req (with the options applied) is no retry, the
// coordinator has wake-ups and the acquisition is no try of a Runner's
// already (wt is nil); else nil.
func (jt *JobType) queueTurn(opts []AcquireOption, req AcquireRequest, wt *waitTry) *waitTry {
	if req.Retry || jt.coord.wakes == nil || wt != nil {
		return nil
	}
	for _, o := range opts {
		if _, ok := o.(queueTurnOption); ok {
			return &waitTry{inTurn: true}
		}
	}
	return nil
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
