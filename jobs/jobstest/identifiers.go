package jobstest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobkeys/jobkeys/jobs"
)

func init() {
	register("IdentifiersAreAnyText", testIdentifiers)
}

// awkward are identifiers a store must keep apart though a naive mapping
// to KV keys or subjects would merge or refuse them.
var awkward = []string{
	"a", "A", "a.b", "a_b", "a-b", "a b", "a/b", "a\\b", "a*", "a>", "*", ">", ".", "..", "_", "=",
	"a%2Eb", "a=2Eb", "é", "e\u0301", "日本", "a\tb", "a\nb", "a\x00b", "a\x7fb",
	strings.Repeat(".", jobs.IdentifierSizeLimit),
	strings.Repeat("é", jobs.IdentifierSizeLimit/2),
}

func testIdentifiers(t *testing.T, h *harness) {
	for i, ch := range []string{"chan.x", "chan_x", "chan x", strings.Repeat("*", jobs.IdentifierSizeLimit)} {
		h.ch = ch
		for j, id := range awkward {
			r := h.req(id, awkward[(j+i)%len(awkward)])
			r.IdempotencyKey = awkward[(j+2*i+1)%len(awkward)]
			r.Fingerprint = fmt.Sprintf("fp-%d", j)
			r.Origin = awkward[(j+3)%len(awkward)]
			r.Type = awkward[(j+5)%len(awkward)]
			r.Input = nil
			out, err := h.store.Enqueue(h.ctx, r)
			noErr(t, err, fmt.Sprintf("enqueue %q in %q", id, ch))
			equal(t, out.Repeated, false, fmt.Sprintf("%q in %q: Repeated", id, ch))
			equal(t, out.Job.TargetGeneration, uint64(1), fmt.Sprintf("%q in %q: a fresh target", id, ch))
		}
		p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: ch, Limit: jobs.ListLimit})
		noErr(t, err, "list "+ch)
		equal(t, len(p.Jobs), len(awkward), "jobs listed in "+ch)
		for j, id := range awkward {
			d, err := h.store.Get(h.ctx, ch, id)
			noErr(t, err, fmt.Sprintf("get %q in %q", id, ch))
			equal(t, d.Job.ID, id, "ID")
			equal(t, d.Job.ChannelID, ch, "ChannelID")
			equal(t, d.Job.TargetKey, awkward[(j+i)%len(awkward)], "TargetKey")
			equal(t, d.Job.IdempotencyKey, awkward[(j+2*i+1)%len(awkward)], "IdempotencyKey")
			equal(t, d.Job.Origin, awkward[(j+3)%len(awkward)], "Origin")
			equal(t, d.Job.Type, awkward[(j+5)%len(awkward)], "Type")
			equal(t, d.Target.TargetKey, d.Job.TargetKey, "Target.TargetKey")
		}
		// Replays find each key again.
		for j, id := range awkward {
			r := h.req("other", "x")
			r.Input = nil
			r.IdempotencyKey = awkward[(j+2*i+1)%len(awkward)]
			r.Fingerprint = fmt.Sprintf("fp-%d", j)
			out, err := h.store.Enqueue(h.ctx, r)
			noErr(t, err, fmt.Sprintf("replay key %q in %q", r.IdempotencyKey, ch))
			equal(t, out.Repeated, true, "Repeated")
			equal(t, out.Job.ID, id, "replayed job")
		}
	}
	// Claims, claimed calls and deletes work with them too.
	got, err := h.store.Claim(h.ctx, jobs.ClaimRequest{Owner: awkward[2], Count: jobs.ClaimCountLimit, TTL: time.Minute})
	noErr(t, err, "claim")
	equal(t, len(got), jobs.ClaimCountLimit, "claimed")
	for _, j := range got {
		_, err := h.store.Settle(h.ctx, jobs.SettleRequest{Claim: jobs.ClaimOf(j)})
		noErr(t, err, fmt.Sprintf("settle %q in %q", j.ID, j.ChannelID))
	}
	noErr(t, h.store.DeleteChannel(h.ctx, "chan.x"), "delete chan.x")
	for _, ch := range []string{"chan_x", "chan x"} {
		p, err := h.store.List(h.ctx, jobs.ListRequest{ChannelID: ch, Limit: jobs.ListLimit})
		noErr(t, err, "list "+ch)
		equal(t, len(p.Jobs), len(awkward), "jobs of "+ch+" after deleting chan.x")
	}
}
