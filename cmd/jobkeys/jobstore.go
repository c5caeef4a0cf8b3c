package main

import (
	"context"
	"fmt"

	"github.com/jobkeys/jobkeys/jobs"
)

// openNATSJobs opens the job store in the bucket --jobs-bucket; a missing
// bucket is an error naming it (exit code 3).
func openNATSJobs(_ context.Context, s *session, o *options) (jobs.Store, error) {
	st, err := jobs.NewNATSStore(s.js, nil, jobs.WithBucket(o.jobsBucket))
	if err != nil {
		return nil, fmt.Errorf("job store in KV bucket %q: %w", o.jobsBucket, err)
	}
	return st, nil
}
