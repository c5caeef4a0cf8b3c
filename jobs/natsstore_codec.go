package jobs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"time"
)

// natsRecordVersion is the version of the stored job record format.
const natsRecordVersion = 1

// natsMaxBatch bounds the messages of an enqueue's batch, and so a record's
// RevisionOffset.
const natsMaxBatch = 16

// natsJobRecord is a job as NATSStore stores it under its "job" key. The
// job's Revision is not stored: it is the KV entry's revision (a stream
// sequence), known only once written. For the same reason a progress entry
// or artifact written by the write that produced the value carries revision
// 0 in the value and takes the entry's revision when read.
type natsJobRecord struct {
	V int `json:"v"`
	// RevisionOffset is added to the entry's revision to give the job's:
	// a job superseded by an enqueue is written in the enqueue's batch
	// just before the new job, whose revision (the batch's last sequence;
	// a batch's sequences are contiguous) is the change's.
	RevisionOffset uint64 `json:"revisionOffset,omitempty"`
	// Revision, when set, is the job's revision, earlier than the entry's:
	// an enqueue written key by key (natsstore_enqueue.go) stamps the job
	// it makes and the job it supersedes with the revision of its commit,
	// written before either record.
	Revision uint64 `json:"revision,omitempty"`
	// ActiveSeq is the sequence of the job's active entry, so that the
	// terminal write's purge of it touches that one message; 0 when
	// unknown. ActiveOffset gives it in a record an enqueue wrote, before
	// the sequences were known: the entry's revision less ActiveOffset.
	ActiveSeq        uint64             `json:"activeSeq,omitempty"`
	ActiveOffset     uint64             `json:"activeOffset,omitempty"`
	ID               string             `json:"id"`
	ChannelID        string             `json:"channelId"`
	Type             string             `json:"type"`
	Version          int                `json:"version"`
	Origin           string             `json:"origin,omitempty"`
	TargetKey        string             `json:"targetKey"`
	TargetGeneration uint64             `json:"targetGeneration"`
	IdempotencyKey   string             `json:"idempotencyKey"`
	Fingerprint      string             `json:"fingerprint"`
	Input            json.RawMessage    `json:"input,omitempty"`
	State            State              `json:"state"`
	Attempts         int                `json:"attempts"`
	Failures         int                `json:"failures"`
	ClaimGeneration  uint64             `json:"claimGeneration"`
	ClaimOwner       string             `json:"claimOwner,omitempty"`
	ClaimBinding     json.RawMessage    `json:"claimBinding,omitempty"`
	ClaimExpiresAt   time.Time          `json:"claimExpiresAt,omitzero"`
	AvailableAt      time.Time          `json:"availableAt"`
	Reason           string             `json:"reason,omitempty"`
	Progress         []natsProgress     `json:"progress,omitempty"`
	CreatedAt        time.Time          `json:"createdAt"`
	UpdatedAt        time.Time          `json:"updatedAt"`
	Artifact         *natsArtifactValue `json:"artifact,omitempty"`
	// Staged marks a record an unbatched enqueue wrote before its commit,
	// the write of the job's target (see natsstore_enqueue.go): the job
	// exists once its target names it at its generation, and not before.
	Staged *natsStaged `json:"staged,omitempty"`
	// Supersede marks an active job's record as superseded once its
	// target reaches a later generation: an unbatched enqueue of the next
	// generation writes it before its commit (see natsstore_enqueue.go).
	Supersede *natsSupersede `json:"supersede,omitempty"`
}

// natsSupersede is what a Supersede mark holds.
type natsSupersede struct {
	// At is the superseded job's UpdatedAt once superseded.
	At time.Time `json:"at"`
}

// natsStaged is what a staged job record holds beyond the job.
type natsStaged struct {
	// Prev is the job the target named when the record was staged (""
	// when the target had none): the job the enqueue supersedes once it
	// is committed.
	Prev string `json:"prev,omitempty"`
}

type natsProgress struct {
	Revision  uint64        `json:"revision,omitempty"`
	Attempt   int           `json:"attempt"`
	Stage     string        `json:"stage"`
	Label     string        `json:"label"`
	State     ProgressState `json:"state"`
	Reason    string        `json:"reason,omitempty"`
	CreatedAt time.Time     `json:"createdAt"`
}

type natsArtifactValue struct {
	Revision  uint64          `json:"revision,omitempty"`
	Value     json.RawMessage `json:"value"`
	CreatedAt time.Time       `json:"createdAt"`
}

// natsIdemRecord is the value under an "idem" key.
type natsIdemRecord struct {
	JobID       string `json:"jobId"`
	Fingerprint string `json:"fingerprint"`
}

// natsTargetRecord is the value under a "target" key: the target's current
// generation and the job that holds it; an unbatched enqueue's last write,
// its commit (natsstore_enqueue.go). Only that job can be active: an
// enqueue supersedes the previous one in the same atomic batch, or marks
// it superseded before its commit.
type natsTargetRecord struct {
	Generation uint64 `json:"generation"`
	JobID      string `json:"jobId"`
}

// encodeNATSJob encodes j (and its artifact, once settled) for a write.
// The rules stamp what this write adds with revision 0, the placeholder
// decodeNATSJob replaces with the entry's revision.
// offset is the record's RevisionOffset.
func encodeNATSJob(j *Job, art *Artifact, offset uint64) ([]byte, error) {
	return encodeNATSJobMeta(j, art, natsMeta{revOffset: offset})
}

// natsMeta is what a record holds beyond the job: see natsJobRecord.
type natsMeta struct {
	revOffset    uint64
	revision     uint64
	activeSeq    uint64
	activeOffset uint64
	staged       *natsStaged
	supersede    *natsSupersede
}

func encodeNATSJobMeta(j *Job, art *Artifact, meta natsMeta) ([]byte, error) {
	r := natsJobRecord{
		V: natsRecordVersion, RevisionOffset: meta.revOffset, Revision: meta.revision, ActiveSeq: meta.activeSeq, ActiveOffset: meta.activeOffset, ID: j.ID, ChannelID: j.ChannelID, Type: j.Type, Version: j.Version,
		Origin: j.Origin, TargetKey: j.TargetKey, TargetGeneration: j.TargetGeneration,
		IdempotencyKey: j.IdempotencyKey, Fingerprint: j.Fingerprint, Input: j.Input,
		State: j.State, Attempts: j.Attempts, Failures: j.Failures, ClaimGeneration: j.ClaimGeneration,
		ClaimOwner: j.ClaimOwner, ClaimBinding: j.ClaimBinding, ClaimExpiresAt: j.ClaimExpiresAt,
		AvailableAt: j.AvailableAt, Reason: j.Reason, CreatedAt: j.CreatedAt, UpdatedAt: j.UpdatedAt,
		Staged: meta.staged, Supersede: meta.supersede,
	}
	for _, p := range j.Progress {
		//lint:ignore S1016 the stored record is spelled out field by field so that a change to Progress cannot change the wire format unnoticed
		r.Progress = append(r.Progress, natsProgress{
			Revision: p.Revision, Attempt: p.Attempt, Stage: p.Stage, Label: p.Label,
			State: p.State, Reason: p.Reason, CreatedAt: p.CreatedAt,
		})
	}
	if art != nil {
		r.Artifact = &natsArtifactValue{Revision: art.Revision, Value: art.Value, CreatedAt: art.CreatedAt}
	}
	if b, ok := appendNATSRecord(make([]byte, 0, natsRecordSize(&r)), &r); ok {
		return b, nil
	}
	return marshalNATSRecord(r)
}

// marshalNATSRecord is encoding/json's encoding of r, which defines the
// format (r is a copy so that only this path puts a record on the heap).
func marshalNATSRecord(r natsJobRecord) ([]byte, error) {
	return json.Marshal(&r)
}

// decodeNATSJob decodes and validates the value of key at revision rev (the
// entry's; the job's is rev plus the record's RevisionOffset). Any
// value that does not decode or validate is ErrCorrupt naming the job and
// the key. The returned job and artifact share no memory with data.
func decodeNATSJob(key string, rev uint64, data []byte, wantChannel, wantJob string) (Job, *Artifact, error) {
	j, art, _, err := decodeNATSJobMeta(key, rev, data, wantChannel, wantJob)
	return j, art, err
}

// decodeNATSJobMeta is decodeNATSJob that also returns the sequence of the
// job's active entry (0: unknown).
//
// Neither tells a staged record (see natsJobRecord.Staged) from another:
// a reader that may meet one reads with decodeNATSJobStaged.
func decodeNATSJobMeta(key string, rev uint64, data []byte, wantChannel, wantJob string) (Job, *Artifact, uint64, error) {
	j, art, activeSeq, _, err := decodeNATSJobStaged(key, rev, data, wantChannel, wantJob)
	return j, art, activeSeq, err
}

// natsMarks are the marks of a job record an unbatched enqueue writes
// (natsJobRecord.Staged and Supersede); nil: none.
type natsMarks struct {
	staged    *natsStaged
	supersede *natsSupersede
}

// any reports whether the record holds a mark.
func (m natsMarks) any() bool { return m.staged != nil || m.supersede != nil }

// decodeNATSJobStaged is decodeNATSJobMeta that also returns the record's
// marks: the job is as stored, before they are resolved (see
// natsstore_enqueue.go).
func decodeNATSJobStaged(key string, rev uint64, data []byte, wantChannel, wantJob string) (Job, *Artifact, uint64, natsMarks, error) {
	r, ok := parseNATSRecord(data, wantChannel, wantJob)
	if !ok {
		var err error
		if r, err = unmarshalNATSRecord(data); err != nil {
			return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, err)
		}
	}
	if r.ActiveOffset > natsMaxBatch || r.ActiveSeq >= rev || r.ActiveOffset >= rev {
		return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, fmt.Errorf("active entry sequence %d or offset %d", r.ActiveSeq, r.ActiveOffset))
	}
	activeSeq := r.ActiveSeq
	if activeSeq == 0 && r.ActiveOffset > 0 {
		activeSeq = rev - r.ActiveOffset
	}
	if r.RevisionOffset > natsMaxBatch || rev > math.MaxUint64-r.RevisionOffset {
		return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, fmt.Errorf("revision offset %d exceeds a batch", r.RevisionOffset))
	}
	rev += r.RevisionOffset
	if r.Revision != 0 {
		if r.RevisionOffset != 0 || r.Revision > rev {
			return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, fmt.Errorf("revision %d with offset %d, past the entry's", r.Revision, r.RevisionOffset))
		}
		rev = r.Revision
	}
	if err := validateNATSRecord(&r, rev, wantChannel, wantJob); err != nil {
		return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, err)
	}
	j := Job{
		ID: r.ID, ChannelID: r.ChannelID, Type: r.Type, Version: r.Version, Origin: r.Origin,
		TargetKey: r.TargetKey, TargetGeneration: r.TargetGeneration, IdempotencyKey: r.IdempotencyKey,
		Fingerprint: r.Fingerprint, Input: natsNull(r.Input), State: r.State, Revision: rev,
		Attempts: r.Attempts, Failures: r.Failures, ClaimGeneration: r.ClaimGeneration,
		ClaimOwner: r.ClaimOwner, ClaimBinding: natsNull(r.ClaimBinding),
		ClaimExpiresAt: r.ClaimExpiresAt.UTC(), AvailableAt: r.AvailableAt.UTC(), Reason: r.Reason,
		CreatedAt: r.CreatedAt.UTC(), UpdatedAt: r.UpdatedAt.UTC(),
	}
	if r.ClaimExpiresAt.IsZero() {
		j.ClaimExpiresAt = time.Time{}
	}
	if len(r.Progress) > 0 {
		j.Progress = make([]Progress, len(r.Progress))
		for i, p := range r.Progress {
			pr := p.Revision
			if pr == 0 {
				pr = rev
			}
			j.Progress[i] = Progress{Revision: pr, Attempt: p.Attempt, Stage: p.Stage, Label: p.Label,
				State: p.State, Reason: p.Reason, CreatedAt: p.CreatedAt.UTC()}
		}
	}
	var art *Artifact
	if r.Artifact != nil {
		ar := r.Artifact.Revision
		if ar == 0 {
			ar = rev
		}
		art = &Artifact{JobID: r.ID, Revision: ar, Value: natsNull(r.Artifact.Value), CreatedAt: r.Artifact.CreatedAt.UTC()}
	}
	if msg := checkJob(&j); msg != "" { // natsCorrupt names the job: not validateJob's message
		return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, errors.New(msg))
	}
	if art != nil {
		if err := validateArtifact(art, &j); err != nil {
			return Job{}, nil, 0, natsMarks{}, natsCorrupt(wantJob, key, rev, err)
		}
	}
	return j, art, activeSeq, natsMarks{staged: r.Staged, supersede: r.Supersede}, nil
}

// unmarshalNATSRecord decodes a stored job record with encoding/json, which
// defines the format: the record's fields and nothing else, one JSON value.
func unmarshalNATSRecord(data []byte) (natsJobRecord, error) {
	var r natsJobRecord
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return natsJobRecord{}, fmt.Errorf("does not decode: %w", err)
	}
	if dec.More() {
		return natsJobRecord{}, errors.New("trailing data after the record")
	}
	return r, nil
}

func natsCorrupt(jobID, key string, rev uint64, err error) error {
	return fmt.Errorf("%w: job %q: KV key %q (revision %d): %w", ErrCorrupt, jobID, key, rev, err)
}

// validateNATSRecord checks what the record format adds to [validateJob]:
// the format version, the key the record is stored under, an artifact
// exactly when completed, and no revision later than the record's own.
func validateNATSRecord(r *natsJobRecord, rev uint64, wantChannel, wantJob string) error {
	switch {
	case r.V != natsRecordVersion:
		return fmt.Errorf("record version %d is not %d", r.V, natsRecordVersion)
	case r.ID != wantJob || r.ChannelID != wantChannel:
		return fmt.Errorf("record of job %q in channel %q stored under job %q in channel %q", r.ID, r.ChannelID, wantJob, wantChannel)
	case (r.State == StateCompleted) != (r.Artifact != nil):
		return fmt.Errorf("%s with artifact %t", r.State, r.Artifact != nil)
	case r.Staged != nil && (r.State != StatePending || r.Supersede != nil):
		return fmt.Errorf("staged record in state %s, supersede mark %t (only a pending job is staged)", r.State, r.Supersede != nil)
	case r.Supersede != nil && !r.State.Active():
		return fmt.Errorf("supersede mark on a %s job", r.State)
	case r.Artifact != nil && r.Artifact.Revision > rev:
		return fmt.Errorf("artifact revision %d is later than the record's %d", r.Artifact.Revision, rev)
	}
	for i, p := range r.Progress {
		if p.Revision > rev {
			return fmt.Errorf("progress %d: revision %d is later than the record's %d", i, p.Revision, rev)
		}
	}
	return nil
}

// natsNull copies raw JSON; nil and JSON null become nil.
func natsNull(b json.RawMessage) json.RawMessage {
	if string(b) == "null" {
		return nil
	}
	return cloneRaw(b)
}

// encodeNATSIdem encodes an "idem" value.
func encodeNATSIdem(r natsIdemRecord) ([]byte, error) {
	if b, ok := appendNATSIdem(make([]byte, 0, 36+len(r.JobID)+len(r.Fingerprint)), r); ok {
		return b, nil
	}
	return json.Marshal(r)
}

// encodeNATSTarget encodes a "target" value.
func encodeNATSTarget(r natsTargetRecord) ([]byte, error) {
	if b, ok := appendNATSTarget(make([]byte, 0, 52+len(r.JobID)), r); ok {
		return b, nil
	}
	return json.Marshal(r)
}

// decodeNATSIdem decodes an "idem" value.
func decodeNATSIdem(key string, rev uint64, data []byte) (natsIdemRecord, error) {
	var r natsIdemRecord
	if err := json.Unmarshal(data, &r); err != nil || r.JobID == "" || r.Fingerprint == "" {
		if err == nil {
			err = errors.New("empty job id or fingerprint")
		}
		return r, fmt.Errorf("%w: idempotency record: KV key %q (revision %d): %w", ErrCorrupt, key, rev, err)
	}
	return r, nil
}

// decodeNATSTarget decodes a "target" value.
func decodeNATSTarget(key string, rev uint64, data []byte) (natsTargetRecord, error) {
	var r natsTargetRecord
	if err := json.Unmarshal(data, &r); err != nil || r.JobID == "" || r.Generation == 0 {
		if err == nil {
			err = errors.New("empty job id or generation 0")
		}
		return r, fmt.Errorf("%w: target record: KV key %q (revision %d): %w", ErrCorrupt, key, rev, err)
	}
	return r, nil
}
