package console

import (
	"context"
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

	"github.com/outboxrelay/outbox"
)

//go:embed templates/*.html
var templateFiles embed.FS

//go:embed static
var staticFiles embed.FS

// Defaults of Options.
const (
	// StoreTimeoutDefault bounds each store call of a request.
	StoreTimeoutDefault = 30 * time.Second
	// PageSizeDefault is how many dead letters a page lists.
	PageSizeDefault = 50
	// PageSizeMax bounds the page size a URL may ask for.
	PageSizeMax = 500
	// PollEveryDefault is how often the overview page refreshes its live
	// part.
	PollEveryDefault = 2 * time.Second
)

// Options configures a console.
type Options struct {
	// Store is the outbox. Required. The pages of status, dead letters
	// and find need it to implement outbox.AdminStore; for a store that
	// does not, they say that it cannot show them.
	Store outbox.Source
	// StoreKind names the store in the page header ("postgres").
	StoreKind string
	// Live is the relay of this process, or nil (`outbox console`).
	Live Live
	// ReadOnly hides every action and refuses every POST but sign-in.
	ReadOnly bool
	// Auth authenticates users; nil allows loopback clients only.
	Auth *Auth
	// Logger receives a line per action (who, what, how many) and
	// refusals; nil discards.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// RefreshMin is how often the overview reads the store's status at
	// most (default RefreshMinDefault); it also waits five times as long
	// as the last read took.
	RefreshMin time.Duration
	// StoreTimeout bounds each store call (default StoreTimeoutDefault).
	StoreTimeout time.Duration
	// PollEvery is how often the overview page fetches its live part
	// (default PollEveryDefault).
	PollEvery time.Duration
}

// Server serves the console. Create it with [New]; Close stops its
// sampler.
type Server struct {
	opts   Options
	log    *slog.Logger
	now    func() time.Time
	admin  outbox.AdminStore // nil: the store cannot show its status nor dead letters
	ov     *overview
	pages  map[string]*template.Template
	csrf   csrf
	cop    *http.CrossOriginProtection
	static http.Handler

	stop context.CancelFunc
	wg   sync.WaitGroup
}

// New returns a console for o.Store. With o.Live it starts sampling the
// relay's totals, until Close.
func New(o Options) (*Server, error) {
	if o.Store == nil {
		return nil, errors.New("console: Options.Store is required")
	}
	s := &Server{opts: o, log: o.Logger, now: o.Now, csrf: newCSRF(), cop: http.NewCrossOriginProtection()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.opts.StoreTimeout <= 0 {
		s.opts.StoreTimeout = StoreTimeoutDefault
	}
	if s.opts.PollEvery <= 0 {
		s.opts.PollEvery = PollEveryDefault
	}
	if s.opts.RefreshMin <= 0 {
		s.opts.RefreshMin = RefreshMinDefault
	}
	s.admin, _ = o.Store.(outbox.AdminStore)
	s.ov = &overview{admin: s.admin, refreshMin: s.opts.RefreshMin, timeout: s.opts.StoreTimeout, now: s.now}
	var err error
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	sub, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	s.static = http.StripPrefix("/static/", http.FileServerFS(sub))
	ctx, stop := context.WithCancel(context.Background())
	s.stop = stop
	if o.Live != nil {
		s.wg.Go(func() { s.ov.runSampler(ctx, o.Live) })
	}
	return s, nil
}

// Close stops the sampler. The handler keeps working.
func (s *Server) Close() {
	s.stop()
	s.wg.Wait()
}

// Handler returns the console's HTTP handler, to serve at the root of a
// server (its paths start at /).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.handleOverview)
	mux.HandleFunc("GET /overview/live", s.handleOverviewLive)
	mux.HandleFunc("GET /api/overview", s.handleOverviewJSON)
	mux.HandleFunc("GET /partitions", s.handlePartitions)
	mux.HandleFunc("GET /dead-letters", s.handleDeadLetters)
	mux.HandleFunc("GET /dead-letters/{id}", s.handleDeadLetter)
	mux.HandleFunc("POST /dead-letters/confirm", s.handleConfirm)
	mux.HandleFunc("POST /dead-letters/apply", s.handleApply)
	mux.HandleFunc("GET /find", s.handleFind)
	mux.HandleFunc("GET /messages/{id}", s.handleMessage)
	mux.HandleFunc("GET /sign-in", s.handleSignInPage)
	mux.HandleFunc("POST /sign-in", s.handleSignIn)
	mux.HandleFunc("POST /sign-out", s.handleSignOut)
	mux.Handle("GET /static/", s.static)
	return s.gate(mux)
}

type ctxKey int

const userKey ctxKey = 0

// visitor is who sent a request.
type visitor struct {
	User     string // shown and logged: a basic-auth user, "token", or "local"
	Identity string // what CSRF tokens are tied to
	Remote   string
}

func visitorOf(r *http.Request) visitor {
	v, _ := r.Context().Value(userKey).(visitor)
	return v
}

// gate sets the security headers, authenticates, refuses what may not pass
// and checks POSTs against cross-site requests.
func (s *Server) gate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-store")
		v := visitor{Remote: r.RemoteAddr}
		open := r.URL.Path == "/sign-in" || strings.HasPrefix(r.URL.Path, "/static/")
		switch {
		case s.opts.Auth == nil:
			if !loopbackClient(r) {
				s.log.Warn("console: refused a request beyond loopback: no authentication is configured", "remote", r.RemoteAddr, "host", r.Host, "path", r.URL.Path)
				http.Error(w, "This console has no authentication configured, so it answers only loopback clients (127.0.0.1, ::1, localhost). Start it with --basic-auth-file or --token-file to reach it from elsewhere.", http.StatusForbidden)
				return
			}
			v.User, v.Identity = "local", "local"
		default:
			user, id, ok := s.opts.Auth.identify(r, s.now())
			if !ok && !open {
				s.unauthorized(w, r)
				return
			}
			v.User, v.Identity = user, id
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if err := s.cop.Check(r); err != nil {
				s.log.Warn("console: refused a cross-origin request", "remote", r.RemoteAddr, "user", v.User, "path", r.URL.Path, "err", err)
				http.Error(w, "cross-origin request refused", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey, v)))
	})
}

// unauthorized answers 401: a basic-auth challenge, and the sign-in form
// when a token is configured.
func (s *Server) unauthorized(w http.ResponseWriter, r *http.Request) {
	if s.opts.Auth.Basic() {
		w.Header().Set("WWW-Authenticate", `Basic realm="outbox console", charset="UTF-8"`)
	}
	if strings.HasPrefix(r.URL.Path, "/api/") || strings.HasPrefix(r.URL.Path, "/overview/") || !s.opts.Auth.Token() {
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	s.render(w, r, http.StatusUnauthorized, "signin", &signInView{page: s.signInPage(r)})
}

// page is what every page's layout needs.
type page struct {
	Title     string
	Nav       string
	StoreKind string
	Node      string
	ReadOnly  bool
	User      string
	SignedIn  bool // with a session cookie: show "sign out"
	CSRF      string
	Notice    string
	// SignIn is the sign-in page: no navigation, no quick find (they only
	// lead back to it).
	SignIn bool
}

func (s *Server) page(r *http.Request, nav, title string) page {
	v := visitorOf(r)
	p := page{Title: title, Nav: nav, StoreKind: s.opts.StoreKind, ReadOnly: s.opts.ReadOnly, User: v.User,
		SignedIn: strings.HasPrefix(v.Identity, "session:"), CSRF: s.csrf.token(v.Identity)}
	if s.opts.Live != nil {
		p.Node = s.opts.Live.Node()
	}
	return p
}

// signInPage is the page of the sign-in form.
func (s *Server) signInPage(r *http.Request) page {
	p := s.page(r, "", "Sign in")
	p.SignIn = true
	return p
}

// render executes a page template.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	t, ok := s.pages[name]
	if !ok {
		http.Error(w, "no such page template: "+name, http.StatusInternalServerError)
		return
	}
	var b strings.Builder
	if err := t.ExecuteTemplate(&b, "layout", data); err != nil {
		s.log.Error("console: render", "page", name, "err", err)
		http.Error(w, "render failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// errorView is the page of a failure.
type errorView struct {
	page
	Message string
}

// fail renders an error page.
func (s *Server) fail(w http.ResponseWriter, r *http.Request, status int, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	if status >= 500 {
		s.log.Warn("console: request failed", "path", r.URL.Path, "err", msg)
	}
	s.render(w, r, status, "error", &errorView{page: s.page(r, "", http.StatusText(status)), Message: msg})
}

// storeCtx bounds a store call.
func (s *Server) storeCtx(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), s.opts.StoreTimeout)
}

// checkAction refuses an action in read-only mode or without a valid CSRF
// token. It parses the form.
func (s *Server) checkAction(w http.ResponseWriter, r *http.Request) bool {
	if s.opts.ReadOnly {
		s.fail(w, r, http.StatusForbidden, "This console is read-only: it changes nothing.")
		return false
	}
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, http.StatusBadRequest, "bad form: %v", err)
		return false
	}
	v := visitorOf(r)
	if !s.csrf.valid(v.Identity, r.PostForm.Get("csrf")) {
		s.log.Warn("console: refused an action without a valid CSRF token", "user", v.User, "remote", v.Remote, "path", r.URL.Path)
		s.fail(w, r, http.StatusForbidden, "The form's security token is missing or stale: reload the page and try again.")
		return false
	}
	return true
}

// signInView is the sign-in page.
type signInView struct {
	page
	Failed bool
}

func (s *Server) handleSignInPage(w http.ResponseWriter, r *http.Request) {
	if !s.opts.Auth.Token() {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return
	}
	s.render(w, r, http.StatusOK, "signin", &signInView{page: s.signInPage(r)})
}

func (s *Server) handleSignIn(w http.ResponseWriter, r *http.Request) {
	if !s.opts.Auth.Token() {
		s.fail(w, r, http.StatusNotFound, "This console has no token to sign in with.")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	id, ok := s.opts.Auth.signIn(r.PostFormValue("token"), s.now())
	if !ok {
		s.log.Warn("console: sign-in with a wrong token", "remote", r.RemoteAddr)
		s.render(w, r, http.StatusUnauthorized, "signin", &signInView{page: s.signInPage(r), Failed: true})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: int(SessionTTL.Seconds())})
	s.log.Info("console: signed in with the token", "remote", r.RemoteAddr)
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

func (s *Server) handleSignOut(w http.ResponseWriter, r *http.Request) {
	if !s.checkCSRFOnly(w, r) {
		return
	}
	if c, err := r.Cookie(sessionCookie); err == nil && s.opts.Auth != nil {
		s.opts.Auth.signOut(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/sign-in", http.StatusSeeOther)
}

// checkCSRFOnly checks the CSRF token of a POST that read-only mode allows.
func (s *Server) checkCSRFOnly(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !s.csrf.valid(visitorOf(r).Identity, r.PostFormValue("csrf")) {
		s.fail(w, r, http.StatusForbidden, "The form's security token is missing or stale: reload the page and try again.")
		return false
	}
	return true
}
