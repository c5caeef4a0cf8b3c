package jobs

import (
	"encoding/json"
	"time"
)

// Periodic is a job enqueued on a schedule: every Every, or at the times
// a five-field Cron expression names.
type Periodic struct {
	Name  string
	Type  string
	Input json.RawMessage
	Every time.Duration
	Cron  string
}
