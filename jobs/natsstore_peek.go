package jobs

import "context"

// peekJobs reads the records of refs alone, in batched reads of up to
// natsReadChunk keys (getMany): what reconciliation reads of a key's
// queued jobs (see jobsPeeker). A job without a record, whose ids the
// store could not hold, or whose enqueue did not commit, is absent from
// the result; a record that does not decode is an error.
func (s *NATSStore) peekJobs(ctx context.Context, refs []jobRef) (map[jobRef]Job, error) {
	const op = "get"
	keys := make([]string, 0, len(refs))
	byKey := make(map[string]jobRef, len(refs))
	for _, r := range refs {
		if prepareGet(r.channel, r.id) != nil {
			continue // no record can have these ids
		}
		k := s.keys.job(r.channel, r.id)
		if _, dup := byKey[k]; !dup {
			keys = append(keys, k)
			byKey[k] = r
		}
	}
	out := make(map[jobRef]Job, len(keys))
	if len(keys) == 0 {
		return out, nil
	}
	read, err := s.getMany(ctx, op, keys)
	if err != nil {
		return nil, err
	}
	for k, m := range read {
		r := byKey[k]
		raw, err := decodeNATSRaw(k, m, r.channel, r.id)
		if err != nil {
			return nil, err
		}
		if !raw.marks.any() {
			out[r] = raw.job
			continue
		}
		// Written by an enqueue key by key: what the record stands for
		// depends on its target (see readJobFull).
		t, err := s.readTarget(ctx, op, r.channel, raw.job.TargetKey)
		if err != nil {
			return nil, err
		}
		if j, found := raw.resolve(t); found {
			out[r] = j
		}
	}
	return out, nil
}
