package console

import (
	"errors"
	"net/http"
	"time"
)

// loginCookie carries the login form's CSRF token before there is a
// session (double submit: another site can post the form but cannot
// read or set this cookie).
const loginCookie = "mefor_login"

// loginData is the login template's data.
type loginData struct {
	CSRFToken string
	SSO       bool
	Username  string
	Error     string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.showLogin(w, r, http.StatusOK, "", "")
}

// showLogin renders the form with a fresh login token.
func (c *Console) showLogin(w http.ResponseWriter, r *http.Request, status int, username, message string) {
	token := randomToken()
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: token, Path: "/login", HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode, MaxAge: int((15 * time.Minute).Seconds())})
	c.render(w, r, status, "login", nil, loginData{CSRFToken: token, SSO: c.opt.SSO, Username: username, Error: message})
}

// login posts the form to POST /api/v1/login and passes its session
// cookie on to the browser.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	ck, err := r.Cookie(loginCookie)
	if err != nil || !sameToken(r.PostFormValue("csrf_token"), ck.Value) {
		c.showLogin(w, r, http.StatusForbidden, "", "The form expired. Sign in again.")
		return
	}
	username := r.PostFormValue("username")
	body := map[string]string{"username": username, "password": r.PostFormValue("password"), "totp": r.PostFormValue("totp")}
	h, err := c.call(r, http.MethodPost, "/api/v1/login", body, "", nil)
	var e *apiError
	if errors.As(err, &e) {
		c.showLogin(w, r, e.Status, username, e.Message)
		return
	}
	if err != nil {
		c.fail(w, r, nil, err)
		return
	}
	for _, v := range h.Values("Set-Cookie") {
		w.Header().Add("Set-Cookie", v)
	}
	http.SetCookie(w, &http.Cookie{Name: loginCookie, Value: "", Path: "/login", MaxAge: -1})
	http.Redirect(w, r, "/", http.StatusSeeOther)
}

// logout ends the session through POST /api/v1/logout, which clears the
// cookie.
func (c *Console) logout(w http.ResponseWriter, r *http.Request, m *me) {
	h, err := c.call(r, http.MethodPost, "/api/v1/logout", nil, m.CSRFToken, nil)
	if err != nil {
		c.fail(w, r, m, err)
		return
	}
	for _, v := range h.Values("Set-Cookie") {
		w.Header().Add("Set-Cookie", v)
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
