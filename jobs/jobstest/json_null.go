package jobstest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("JSONNullIsNoValue", testJSONNullIsNoValue)
}

// testJSONNullIsNoValue pins a deliberate difference from the seed: JSON
// null given as an enqueue's Input, a renewal's Binding or a settle's
// Artifact is stored and handed back as no value (nil), the same as an
// empty one. The seed keeps null as a value (its JsonValue includes null;
// only an undefined binding is none).
func testJSONNullIsNoValue(t *testing.T, h *harness) {
	r := h.req("j1", "doc")
	r.Input = json.RawMessage(" null ")
	j := h.enqueue(r)
	if j.Input != nil {
		t.Errorf("enqueued Input: got %q, want nil", j.Input)
	}
	if got := h.get("j1").Job.Input; got != nil {
		t.Errorf("Input read back: got %q, want nil", got)
	}

	c := h.claimOne("w1", "j1", time.Minute)
	rn, err := h.store.Renew(h.ctx, jobs.RenewRequest{Claim: jobs.ClaimOf(c), ExpectedRevision: c.Revision, TTL: time.Hour, Binding: json.RawMessage(`null`)})
	noErr(t, err, "renew with a null binding")
	if rn.ClaimBinding != nil {
		t.Errorf("renewed ClaimBinding: got %q, want nil", rn.ClaimBinding)
	}
	if got := h.get("j1").Job.ClaimBinding; got != nil {
		t.Errorf("ClaimBinding read back: got %q, want nil", got)
	}

	d, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(c), Artifact: json.RawMessage(`null`)})
	noErr(t, err, "settle with a null artifact")
	for what, a := range map[string]*jobs.Artifact{"settled": d.Artifact, "read back": h.get("j1").Artifact} {
		if a == nil {
			t.Errorf("%s: no artifact, want one without a value", what)
		} else if a.Value != nil {
			t.Errorf("%s Artifact.Value: got %q, want nil", what, a.Value)
		}
	}
}
