package jobsweb

import (
	"net/http"
	"time"
)

// eventsKeepAlive is how often a live stream without changes sends a
// comment, so that proxies keep it open.
const eventsKeepAlive = 15 * time.Second

// events streams the key watch's changes as server-sent events: "key"
// events with a JSON body (see keyEvent), and "resync" when the stream
// fell behind and the page should reload what it shows. The stream ends
// with the request or when the handler is closed.
func (h *Handler) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	changes, cancel := h.hub.subscribe()
	defer cancel()
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	if _, err := w.Write([]byte("retry: 2000\n\n")); err != nil {
		return
	}
	if rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(eventsKeepAlive)
	defer tick.Stop()
	for {
		var msg []byte
		select {
		case <-r.Context().Done():
			return
		case <-tick.C:
			msg = []byte(": keep-alive\n\n")
		case data, ok := <-changes:
			if !ok {
				return // the handler was closed
			}
			if data == nil {
				msg = []byte("event: resync\ndata: {}\n\n")
			} else {
				msg = append(append([]byte("event: key\ndata: "), data...), '\n', '\n')
			}
		}
		if _, err := w.Write(msg); err != nil {
			return
		}
		if rc.Flush() != nil {
			return
		}
	}
}
