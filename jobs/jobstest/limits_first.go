package jobstest

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("LimitsCheckedFirst", testLimitsCheckedFirst)
}

// testLimitsCheckedFirst pins a deliberate difference from the seed, which
// has no size limits: a request over a limit is refused (ErrConflict
// naming the limit) before the store looks for its job, so even for a job
// that does not exist. The seed would answer not found.
func testLimitsCheckedFirst(t *testing.T, h *harness) {
	missing := jobs.Claim{ChannelID: h.ch, JobID: "nope", Owner: "w", Generation: 1}
	reason := strings.Repeat("r", jobs.ReasonSizeLimit+1)
	calls := map[string]func() error{
		"Renew": func() error {
			_, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: missing, ExpectedRevision: 1, TTL: time.Minute,
				Binding: json.RawMessage(`"` + strings.Repeat("b", jobs.BindingSizeLimit) + `"`)})
			return err
		},
		"Requeue": func() error {
			_, err := h.store.Requeue(h.ctx, jobs.RequeueRequest{Claim: missing, Reason: reason})
			return err
		},
		"Fail": func() error {
			_, err := h.store.Fail(h.ctx, jobs.FailRequest{Claim: missing, Reason: reason})
			return err
		},
		"Settle": func() error {
			_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: missing,
				Artifact: json.RawMessage(`"` + strings.Repeat("a", jobs.ArtifactSizeLimit) + `"`)})
			return err
		},
		"Pause": func() error {
			_, err := h.store.Pause(h.ctx, jobs.PauseRequest{ChannelID: h.ch, JobID: "nope", ExpectedRevision: 1, Reason: reason})
			return err
		},
		"Supersede": func() error {
			_, err := h.store.Supersede(h.ctx, jobs.SupersedeRequest{ChannelID: h.ch, JobID: "nope", ExpectedRevision: 1, Reason: reason})
			return err
		},
	}
	for _, name := range sortedKeys(calls) {
		wantErr(t, calls[name](), jobs.ErrConflict, name+" over a limit for a missing job", "limit")
	}
}
