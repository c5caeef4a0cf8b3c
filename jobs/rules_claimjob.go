package jobs

import "time"

// prepareClaimJob checks a ClaimJobRequest.
func prepareClaimJob(req ClaimJobRequest) (ClaimJobRequest, error) {
	const op = "claim job"
	for _, f := range []struct{ name, v string }{{"ChannelID", req.ChannelID}, {"JobID", req.JobID}, {"Owner", req.Owner}} {
		if err := checkString(op, f.name, f.v, IdentifierSizeLimit); err != nil {
			return req, err
		}
		if f.v == "" {
			return req, conflictf("%s: %s must not be empty", op, f.name)
		}
	}
	if req.TTL <= 0 {
		return req, conflictf("%s: TTL %v must be positive", op, req.TTL)
	}
	return req, nil
}

// claimNamedJob is ClaimJob's rule: the job must exist (ErrNotFound) and
// be claimable at now ([claimable]; ErrConflict naming why not); it is then
// claimed as Claim claims it.
func claimNamedJob(j *Job, req ClaimJobRequest, generation uint64, now time.Time, rev uint64) (Job, error) {
	const op = "claim job"
	if j == nil || j.ChannelID != req.ChannelID || j.ID != req.JobID {
		return Job{}, notFoundf("%s: job %q does not exist in channel %q", op, req.JobID, req.ChannelID)
	}
	if !claimable(j, generation, now) {
		switch {
		case j.State != StatePending && j.State != StateRunning:
			return Job{}, conflictf("%s: job %q is %s", op, j.ID, j.State)
		case j.TargetGeneration != generation:
			return Job{}, conflictf("%s: job %q is of generation %d of its target, not the current %d", op, j.ID, j.TargetGeneration, generation)
		case j.State == StatePending:
			return Job{}, conflictf("%s: job %q is not due until %s", op, j.ID, j.AvailableAt.Format(time.RFC3339Nano))
		default:
			return Job{}, conflictf("%s: job %q is claimed until %s", op, j.ID, j.ClaimExpiresAt.Format(time.RFC3339Nano))
		}
	}
	return claimJob(j, ClaimRequest{ChannelID: req.ChannelID, Owner: req.Owner, Count: 1, TTL: req.TTL}, now, rev), nil
}
