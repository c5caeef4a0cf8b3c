// Package jobsweb is a web dashboard for jobkeys: an [http.Handler] that
// shows a deployment's keys and jobs and runs the operator's actions on
// them (cancel, pause, resume, retry) through the library.
//
// # Mounting
//
// Make a [Handler] with [New] over a [jobs.Client] (whose key coordinator
// and service it shows the keys of), or over the job store, the key store
// and its [jobkeys.KeyCoordinator] (New makes a client of them), and mount
// it under any path prefix with [http.StripPrefix]:
//
//	h, err := jobsweb.New(&jobsweb.Config{Client: client})
//	if err != nil { ... }
//	defer h.Close()
//	mux.Handle("/admin/jobs/", http.StripPrefix("/admin/jobs", h))
//
// Every link the pages hold is built from the prefix the request was
// served under, so the same handler works at "/" and at "/admin/jobs".
// Close ends the key watch and the live streams of open pages: call it
// before [http.Server.Shutdown], which otherwise waits for those streams.
//
// # Pages
//
//   - Overview ("/"): per job type, the jobs running and waiting on its keys
//     (exact, from the key state) and the states of the newest jobs of each
//     channel with a sparkline of the jobs finished per minute (a sample:
//     see [StatsSampleDefault]); the keys at their limit.
//   - Keys ("/keys"): per key, its display key, running/limit, waiting/limit,
//     the holders of its slots with their lease age and expiry, the oldest
//     waiting job's age and why the key is blocked; paged, filtered by type,
//     text and state.
//   - Jobs ("/jobs"): a channel's jobs, newest first, filtered by type and
//     state, in cursor pages; a search by id.
//   - Job ("/job"): input, state, reason, attempts and failures, progress
//     entries per attempt, artifact, timestamps, and its key's occupancy now.
//
// # Live updates
//
// The handler watches the key bucket ([jobkeys.KeyCoordinator.WatchOccupancy],
// which collapses heartbeats as "jobkeys keys watch" does) and pushes each
// change to open pages as server-sent events ("/events"); a page reloads
// the part it shows when a change concerns it. The key pages read the
// watch's in-memory copy, so a page of 10,000 keys costs no reads of the
// store; job pages read the job store.
//
// # Safety
//
//   - [Config.ReadOnly] hides the actions and refuses them.
//   - [Config.Authorize] is asked before every page ([ActionView]) and every
//     action; its error refuses the request (403) with its message.
//   - Actions are POSTs from a confirmation page, checked against a CSRF
//     token bound to a cookie (HMAC with a per-handler key) and against
//     cross-origin requests ([http.CrossOriginProtection]).
//   - Everything shown is escaped by html/template; inputs and artifacts
//     over [Config.FieldLimit] bytes are cut, with a download link that
//     serves them as an attachment. Pages send a Content-Security-Policy
//     that allows only the handler's own script and style.
//   - The handler has no listener of its own: "jobkeys ui" and the
//     dashboard example listen on loopback unless told otherwise.
//
// The pages use html/template and a little JavaScript embedded in the
// binary: no CDN, no build step; they work offline.
package jobsweb
