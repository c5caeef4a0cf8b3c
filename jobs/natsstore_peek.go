package jobs

import "context"

// peekJobs reads the records of refs alone, in batched reads (readListed,
// as List reads a page): what reconciliation reads of a key's queued jobs
// (see jobsPeeker). A job without a record, whose ids the store could not
// hold, or whose enqueue did not commit, is absent from the result; a
// record that does not decode is an error.
func (s *NATSStore) peekJobs(ctx context.Context, refs []jobRef) (map[jobRef]Job, error) {
	listed := make([]*Job, 0, len(refs))
	for _, r := range refs {
		if prepareGet(r.channel, r.id) != nil {
			continue // no record can have these ids
		}
		listed = append(listed, &Job{ChannelID: r.channel, ID: r.id})
	}
	out := make(map[jobRef]Job, len(listed))
	if len(listed) == 0 {
		return out, nil
	}
	read, err := s.readListed(ctx, "get", listed)
	if err != nil {
		return nil, err
	}
	for i, j := range read {
		if j != nil {
			out[jobRef{listed[i].ChannelID, listed[i].ID}] = *j
		}
	}
	return out, nil
}
