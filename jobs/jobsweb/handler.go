package jobsweb

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/jobkeys/jobkeys"
	"github.com/jobkeys/jobkeys/jobs"
)

// Defaults of [Config] fields left zero.
const (
	// PageSizeDefault is how many keys or jobs a page shows.
	PageSizeDefault = 50
	// FieldLimitDefault is how many bytes of an input or artifact a job
	// page shows before cutting it (the rest is a download).
	FieldLimitDefault = 4 << 10
	// ScanLimitDefault is how many jobs a filtered jobs page reads at most
	// to fill one page; the page then ends early with a link that goes on.
	ScanLimitDefault = 2000
	// StatsSampleDefault is how many of the newest jobs of each channel the
	// overview counts by type and state.
	StatsSampleDefault = 1000
	// StatsIntervalDefault is how long the overview's counts are reused
	// before they are read again.
	StatsIntervalDefault = 5 * time.Second
)

// Action is what a request does: view a page or change a job. The
// [Config.Authorize] hook receives it.
type Action string

// The actions.
const (
	// ActionView is reading any page, download or live stream.
	ActionView Action = "view"
	// ActionCancel cancels a pending, paused or running job (final).
	ActionCancel Action = "cancel"
	// ActionPause pauses a pending or running job.
	ActionPause Action = "pause"
	// ActionResume makes a paused job pending again, due now.
	ActionResume Action = "resume"
	// ActionRetry runs a failed, cancelled or superseded job again as a new
	// job ([jobs.Client.Retry]).
	ActionRetry Action = "retry"
)

// Config configures a [Handler]. Keys and one of Client or Store are
// required.
type Config struct {
	// Client reads the jobs and runs the actions. When nil, New makes a
	// client over Store, Keys and KeyStore, with no kinds (as the jobkeys
	// CLI does): its actions reach a job's worker at the worker's next
	// heartbeat.
	Client *jobs.Client
	// Store is the job store New makes a client over when Client is nil.
	Store jobs.Store
	// KeyStore is the key store Keys was made with; required with Store.
	KeyStore jobkeys.Store
	// Keys is the coordinator whose keys the pages show and watch; its
	// store must list and watch keys ([jobkeys.NATSStore] and
	// [jobkeys.MemoryStore] do). Required with Store; defaults to
	// Client.KeyCoordinator().
	Keys *jobkeys.KeyCoordinator
	// Service is the key-layer service of the runtime's kinds
	// (jobs.ClientConfig.Service). Defaults to Client.Service(), or
	// jobs.ServiceDefault with Store.
	Service string
	// Channels are job channels the jobs pages offer besides those the
	// handler discovers in the key state (the channels of the jobs that
	// run or wait). Defaults to none.
	Channels []string
	// ReadOnly hides the actions and refuses them (403).
	ReadOnly bool
	// Authorize, when set, is asked before every request with what it does;
	// an error refuses it (403, with the error's message). Defaults to nil:
	// everything is allowed (subject to ReadOnly).
	Authorize func(*http.Request, Action) error
	// PageSize is how many keys or jobs a page shows. Defaults to
	// PageSizeDefault (50); at most jobs.ListLimit for jobs.
	PageSize int
	// FieldLimit is how many bytes of an input or artifact a job page
	// shows; longer ones are cut, with a download link. Defaults to
	// FieldLimitDefault (4 KiB).
	FieldLimit int
	// ScanLimit is how many jobs a filtered jobs page reads at most.
	// Defaults to ScanLimitDefault (2,000).
	ScanLimit int
	// StatsSample is how many of each channel's newest jobs the overview
	// counts. Defaults to StatsSampleDefault (1,000).
	StatsSample int
	// Now is the clock of the relative times shown. Defaults to time.Now.
	Now func() time.Time
	// Logger receives what the handler cannot show on a page (the key
	// watch failing and restarting). Defaults to none.
	Logger *slog.Logger
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Handler is the dashboard. It is safe for concurrent use. Make it with
// [New]; [Handler.Close] stops its key watch and its live streams.
type Handler struct {
	cfg    Config
	jobs   jobSource
	hub    *keyHub
	tmpl   *template.Template
	mux    *http.ServeMux
	csrf   csrfGuard
	stats  statsCache
	stop   context.CancelFunc
	closed sync.Once
}

// jobSource is what the handler reads and changes jobs through: a
// *jobs.Client. Every call of the library the dashboard makes on jobs is
// one of these.
type jobSource interface {
	Get(ctx context.Context, channelID, jobID string) (jobs.Detail, error)
	List(ctx context.Context, req jobs.ListRequest) (jobs.Page, error)
	Cancel(ctx context.Context, req jobs.CancelRequest) (jobs.Job, error)
	Pause(ctx context.Context, req jobs.PauseRequest) (jobs.Job, error)
	Resume(ctx context.Context, req jobs.ResumeRequest) (jobs.Job, error)
	Retry(ctx context.Context, channelID, jobID string) (jobs.Job, error)
}

// New returns a dashboard over cfg; a bad field is an error naming it. It
// starts watching the keys of cfg.Service at once.
func New(cfg *Config) (*Handler, error) {
	if cfg == nil {
		return nil, errors.New("jobsweb: New: Config is required")
	}
	c := *cfg
	if c.Client != nil {
		if c.Keys == nil {
			c.Keys = c.Client.KeyCoordinator()
		}
		if c.Service == "" {
			c.Service = c.Client.Service()
		}
	}
	if c.Keys == nil {
		return nil, errors.New("jobsweb: New: Config.Client, or Config.Keys (the key coordinator) with Config.Store and Config.KeyStore, is required")
	}
	if c.Service == "" {
		c.Service = jobs.ServiceDefault
	}
	for _, f := range []struct {
		name string
		v    *int
		def  int
	}{
		{"PageSize", &c.PageSize, PageSizeDefault},
		{"FieldLimit", &c.FieldLimit, FieldLimitDefault},
		{"ScanLimit", &c.ScanLimit, ScanLimitDefault},
		{"StatsSample", &c.StatsSample, StatsSampleDefault},
	} {
		switch {
		case *f.v == 0:
			*f.v = f.def
		case *f.v < 0:
			return nil, fmt.Errorf("jobsweb: New: Config.%s %d is negative", f.name, *f.v)
		}
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	client := c.Client
	if client == nil {
		if c.Store == nil || c.KeyStore == nil {
			return nil, errors.New("jobsweb: New: Config.Client, or Config.Store with Config.KeyStore, is required")
		}
		var err error
		client, err = jobs.NewClient(c.Store, c.Keys, &jobs.ClientConfig{KeyStore: c.KeyStore, Service: c.Service, Logger: c.Logger})
		if err != nil {
			return nil, fmt.Errorf("jobsweb: New: a client over Config.Store: %w", err)
		}
	}
	tmpl, err := template.New("").Funcs(templateFuncs).ParseFS(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("jobsweb: New: templates: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("jobsweb: New: CSRF key: %w", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	h := &Handler{
		cfg: c, jobs: client, tmpl: tmpl, stop: stop,
		csrf: newCSRFGuard(key),
		hub:  newKeyHub(c.Keys, c.Service, c.Channels, c.Logger),
	}
	h.routes()
	h.hub.start(ctx)
	return h, nil
}

// Close stops the key watch and ends the live streams of open pages. The
// handler still serves pages afterwards, without live updates. Close is
// idempotent and returns nil.
func (h *Handler) Close() error {
	h.closed.Do(func() {
		h.stop()
		h.hub.wait()
	})
	return nil
}

func (h *Handler) routes() {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	mux.Handle("GET /static/", http.StripPrefix("/static", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", h.page(h.overview))
	mux.HandleFunc("GET /keys", h.page(h.keysPage))
	mux.HandleFunc("GET /jobs", h.searchJob)
	mux.HandleFunc("GET /job", h.page(h.jobPage))
	mux.HandleFunc("GET /job/confirm", h.page(h.confirmPage))
	mux.HandleFunc("GET /job/input", h.download(false))
	mux.HandleFunc("GET /job/artifact", h.download(true))
	mux.HandleFunc("POST /job/action", h.action)
	mux.HandleFunc("GET /events", h.events)
	h.mux = mux
}

// ServeHTTP serves the dashboard; see the package docs for its pages.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	hd.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	hd.Set("X-Content-Type-Options", "nosniff")
	hd.Set("X-Frame-Options", "DENY")
	hd.Set("Referrer-Policy", "same-origin")
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		if !strings.HasPrefix(r.URL.Path, "/static/") {
			if err := h.authorize(r, ActionView); err != nil {
				h.fail(w, r, http.StatusForbidden, err)
				return
			}
		}
	}
	h.mux.ServeHTTP(w, r)
}

// authorize asks Config.Authorize, when set.
func (h *Handler) authorize(r *http.Request, a Action) error {
	if h.cfg.Authorize == nil {
		return nil
	}
	if err := h.cfg.Authorize(r, a); err != nil {
		return fmt.Errorf("not authorized to %s: %w", a, err)
	}
	return nil
}

// basePath is the path prefix the handler is mounted under: the request's
// path as sent, less the path the handler sees (http.StripPrefix removed
// the rest). Empty at the root.
func basePath(r *http.Request) string {
	sent := r.RequestURI
	if i := strings.IndexByte(sent, '?'); i >= 0 {
		sent = sent[:i]
	}
	if strings.HasPrefix(sent, "http://") || strings.HasPrefix(sent, "https://") {
		return "" // a proxy request: no prefix to find
	}
	seen := r.URL.EscapedPath()
	base, ok := strings.CutSuffix(sent, seen)
	// A prefix links could not start with safely (another host's, "//x")
	// is none.
	if !ok || !strings.HasPrefix(base, "/") || strings.HasPrefix(base, "//") || strings.ContainsAny(base, "\\\"'<> ") {
		return ""
	}
	return base
}

// view is what every page template receives.
type view struct {
	Title    string
	Nav      string // the page the navigation marks
	Base     string // the prefix links start with
	ReadOnly bool
	CSRF     string // the token an action's form carries
	Live     string // the URL the page's live region reloads from; empty: not live
	LiveJob  string // on a job page: its key-layer job id (live reloads when a change names it)
	LiveGap  int    // the least milliseconds between two live reloads; 0: the script's default
	Now      time.Time
	WatchErr string // why the key watch is not running, if it is not
	Data     any
}

// page wraps a page function: it renders what fn returns into the layout,
// or, with ?fragment=1, the page's live region alone.
func (h *Handler) page(fn func(r *http.Request, v *view) (string, int, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		v := &view{Base: basePath(r), ReadOnly: h.cfg.ReadOnly, Now: h.cfg.Now()}
		v.CSRF = h.csrf.token(w, r, v.Base)
		if err := h.hub.watchErr(); err != nil {
			v.WatchErr = err.Error()
		}
		name, status, err := fn(r, v)
		if err != nil {
			h.fail(w, r, status, err)
			return
		}
		if r.URL.Query().Get("fragment") == "1" {
			name += "-body"
		}
		h.render(w, status, name, v)
	}
}

// render executes template name with v into a buffer, then writes it.
func (h *Handler) render(w http.ResponseWriter, status int, name string, v *view) {
	var b strings.Builder
	if err := h.tmpl.ExecuteTemplate(&b, name, v); err != nil {
		h.cfg.Logger.Error("jobsweb: render", "template", name, "err", err)
		http.Error(w, "jobsweb: the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// fail renders an error page saying what went wrong.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, status int, err error) {
	if status == 0 {
		status = statusOf(err)
	}
	v := &view{Title: http.StatusText(status), Base: basePath(r), ReadOnly: h.cfg.ReadOnly, Now: h.cfg.Now(),
		Data: errorData{Status: status, Message: err.Error()}}
	h.render(w, status, "error", v)
}

type errorData struct {
	Status  int
	Message string
}

// statusOf maps the library's errors to HTTP statuses.
func statusOf(err error) int {
	var bad badRequest
	switch {
	case errors.As(err, &bad):
		return http.StatusBadRequest
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout
	case errors.Is(err, jobs.ErrNotFound), errors.Is(err, jobkeys.ErrKeyNotFound):
		return http.StatusNotFound
	case errors.Is(err, jobs.ErrConflict), errors.Is(err, jobs.ErrRejected):
		return http.StatusConflict
	case errors.Is(err, jobs.ErrUnavailable):
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// badRequest is a request error a page reports as 400.
type badRequest struct{ msg string }

func (e badRequest) Error() string { return e.msg }

func badRequestf(format string, args ...any) error { return badRequest{fmt.Sprintf(format, args...)} }
