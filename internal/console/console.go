package console

import (
	"bytes"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"errors"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/mefor/mefor/internal/identity"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configures the console.
type Options struct {
	// SSO shows "Sign in with SSO" on /login, a link to the API's
	// GET /api/v1/sso/login. Set it when api.sso is. Defaults to false.
	SSO bool
	// Logger logs the API calls that fail for reasons the person cannot
	// act on (ids and statuses, never content). Defaults to discarding.
	Logger *slog.Logger
	// Approvals are the permissions whose actions wait for a second
	// person (access.approvals.required_for, as api.Approvals has them):
	// their buttons say "Request approval". Defaults to none.
	Approvals []identity.Permission
}

// Console serves the pages.
type Console struct {
	api    http.Handler
	opt    Options
	pages  map[string]*template.Template
	mux    *http.ServeMux
	logger *slog.Logger
}

// contentSecurityPolicy allows the console's own styles, scripts and
// images and nothing inline: a value that escaped html/template could
// still not run.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// pageNames are the templates, each rendered inside layout.html.
var pageNames = []string{"login", "dashboard", "messages", "message", "confirm", "error", "dead", "nodes", "reauth", "approvals", "audit"}

// New returns the console's handler; apiHandler is the API's own handler,
// which every page calls (api.Config.Console hands it over). The
// templates are embedded, so one that does not parse is a bug that every
// test of this package reports.
func New(apiHandler http.Handler, o Options) *Console {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	c := &Console{api: apiHandler, opt: o, pages: map[string]*template.Template{}, mux: http.NewServeMux(), logger: o.Logger}
	for _, name := range pageNames {
		c.pages[name] = template.Must(template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/"+name+".html"))
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		panic(err)
	}
	c.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	c.mux.HandleFunc("GET /login", c.loginPage)
	c.mux.HandleFunc("POST /login", c.login)
	c.mux.HandleFunc("POST /logout", c.page(c.logout))
	c.mux.HandleFunc("GET /{$}", c.page(c.dashboard))
	c.mux.HandleFunc("GET /messages", c.page(c.messages))
	c.mux.HandleFunc("POST /messages", c.page(c.messages))
	c.mux.HandleFunc("GET /messages/{id}", c.page(c.message))
	c.mux.HandleFunc("POST /messages/{id}", c.page(c.message))
	c.mux.HandleFunc("GET /dead", c.page(c.dead))
	c.mux.HandleFunc("POST /dead", c.page(c.dead))
	c.mux.HandleFunc("GET /nodes", c.page(c.nodes))
	c.mux.HandleFunc("POST /nodes", c.page(c.nodes))
	c.mux.HandleFunc("GET /approvals", c.page(c.approvals))
	c.mux.HandleFunc("POST /approvals", c.page(c.approvals))
	c.mux.HandleFunc("GET /audit", c.page(c.audit))
	c.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.render(w, r, http.StatusNotFound, "error", nil, errorPage{Title: "Not found", Message: "There is no such page."})
	})
	return c
}

// ServeHTTP sets the security headers every answer carries, then serves
// the page.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", contentSecurityPolicy)
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	c.mux.ServeHTTP(w, r)
}

// me is who the browser's session is, as GET /api/v1/me answers.
type me struct {
	User        string   `json:"user"`
	Role        string   `json:"role"`
	Permissions []string `json:"permissions"`
	Channels    []string `json:"channels"`
	CSRFToken   string   `json:"csrf_token"`
}

// Can reports whether the person's role holds perm: a page shows a
// button only when it does.
func (m *me) Can(perm string) bool { return m != nil && slices.Contains(m.Permissions, perm) }

// page authenticates a page through GET /api/v1/me: without a session it
// sends the browser to /login, and a POST must carry the session's CSRF
// token in its form's csrf_token.
func (c *Console) page(h func(http.ResponseWriter, *http.Request, *me)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var m me
		if _, err := c.call(r, http.MethodGet, "/api/v1/me", nil, "", &m); err != nil {
			var e *apiError
			if errors.As(err, &e) && e.Status == http.StatusUnauthorized {
				http.Redirect(w, r, "/login", http.StatusSeeOther)
				return
			}
			c.fail(w, r, nil, err)
			return
		}
		if r.Method == http.MethodPost && !sameToken(r.PostFormValue("csrf_token"), m.CSRFToken) {
			c.render(w, r, http.StatusForbidden, "error", &m, errorPage{Title: "Refused",
				Message: "This form did not carry your session's CSRF token. Reload the page and try again."})
			return
		}
		h(w, r, &m)
	}
}

func sameToken(a, b string) bool {
	return a != "" && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// errorPage is the error template's data.
type errorPage struct {
	Title, Message string
}

// fail answers an API error as a page: 404 for anything the API says is
// not there or out of scope, 403 with the API's reason, 422 with it, 500
// (logged) for the rest.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, m *me, err error) {
	var e *apiError
	if errors.As(err, &e) {
		switch e.Status {
		case http.StatusNotFound:
			c.render(w, r, http.StatusNotFound, "error", m, errorPage{Title: "Not found", Message: "There is no such page."})
			return
		case http.StatusForbidden, http.StatusUnprocessableEntity, http.StatusTooManyRequests:
			c.render(w, r, e.Status, "error", m, errorPage{Title: "Refused", Message: e.Message})
			return
		}
	}
	c.logger.ErrorContext(r.Context(), "console page failed", "path", r.URL.Path, "err", err)
	c.render(w, r, http.StatusInternalServerError, "error", m, errorPage{Title: "Error", Message: "The page could not be built; see the node's log."})
}

// view is what the layout receives: the person, the page's data and the
// page's name (for the navigation).
type view struct {
	Me   *me
	Page string
	Data any
	Now  time.Time
	// Approver is true when the person holds a permission whose actions
	// wait for a second person: the navigation shows /approvals.
	Approver bool
}

// needsApproval reports whether perm's actions wait for a second person.
func (c *Console) needsApproval(perm string) bool {
	return slices.Contains(c.opt.Approvals, identity.Permission(perm))
}

// approver reports whether m holds a permission whose actions wait for a
// second person, and so may decide others' requests.
func (c *Console) approver(m *me) bool {
	for _, p := range c.opt.Approvals {
		if m.Can(string(p)) {
			return true
		}
	}
	return false
}

// render writes page with data. Pages hold operational data, so none is
// kept by the browser or a proxy.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, page string, m *me, data any) {
	var buf bytes.Buffer
	if err := c.pages[page].Execute(&buf, view{Me: m, Page: page, Data: data, Now: time.Now().UTC(), Approver: c.approver(m)}); err != nil {
		c.logger.ErrorContext(r.Context(), "console template failed", "page", page, "err", err)
		http.Error(w, "the page could not be rendered; see the node's log", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// randomToken is 32 random bytes, URL-safe.
func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// Permissions the pages check, by the API's names.
var (
	permStatus       = string(identity.PermStatus)
	permNodes        = string(identity.PermNodes)
	permAlerts       = string(identity.PermAlertsRead)
	permMessagesRead = string(identity.PermMessagesRead)
	permMessagesBody = string(identity.PermMessagesBody)
	permReplay       = string(identity.PermReplay)
	permDeadRead     = string(identity.PermDeadRead)
	permReplayDead   = string(identity.PermReplayDead)
	permStepdown     = string(identity.PermStepdown)
	permAuditRead    = string(identity.PermAuditRead)
)
