package apiclient

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// sessionCookie is the API's session cookie (api.SessionCookie), whose
// value is the session's token.
const sessionCookie = "mefor_session"

// LoginRequest is a person's credentials.
type LoginRequest struct {
	Username string `json:"username"`
	Password string `json:"password"`
	// TOTP is the second factor's code, or a recovery code; empty for a
	// user without one.
	TOTP string `json:"totp,omitempty"`
}

// Session is a logged-in session: its Token authenticates as a bearer
// token, as an API token does, until ExpiresAt or a logout.
type Session struct {
	Token     string
	User      string    `json:"user"`
	Role      string    `json:"role"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Login logs in at the API o names (o.Token is not used) and returns the
// new session. A refusal is an *Error (401 for wrong credentials, 429
// when the address tried too often).
func Login(ctx context.Context, o Options, req LoginRequest) (*Session, error) {
	c, err := newClient(o)
	if err != nil {
		return nil, err
	}
	c.keep = true
	var s Session
	if _, err := c.Do(ctx, http.MethodPost, "/api/v1/login", req, &s); err != nil {
		return nil, err
	}
	for _, ck := range c.cookies {
		if ck.Name == sessionCookie && ck.Value != "" {
			s.Token = ck.Value
		}
	}
	if s.Token == "" {
		return nil, errors.New("the API's login answer carried no session cookie")
	}
	if s.User == "" {
		return nil, fmt.Errorf("the API's login answer named no user")
	}
	return &s, nil
}
