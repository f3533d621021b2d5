package identity

import (
	"errors"
	"fmt"
)

// ErrLoginFailed is the one answer to every refused login: wrong password,
// unknown user, missing or wrong second factor, locked or disabled account.
// The reason is in the audit log, never in the answer.
var ErrLoginFailed = errors.New("login failed: wrong user name, password or code, or the account is locked")

// ErrUnauthenticated is a session or token that is unknown, expired,
// revoked, or whose user is disabled.
var ErrUnauthenticated = errors.New("not authenticated: the session or token is unknown, expired or revoked")

// NotFoundError is a user or token that does not exist.
type NotFoundError struct {
	Kind string // "user" or "token"
	Name string
}

func (e *NotFoundError) Error() string { return fmt.Sprintf("no %s %s", e.Kind, e.Name) }

// IsNotFound reports whether err is a NotFoundError.
func IsNotFound(err error) bool {
	var nf *NotFoundError
	return errors.As(err, &nf)
}

// InvalidError is a refused value, naming its field (an API answers 422
// with it). Its message never holds a password or code.
type InvalidError struct {
	Field  string
	Reason string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Reason }

// IsInvalid reports whether err is an InvalidError, and returns it.
func IsInvalid(err error) (*InvalidError, bool) {
	var ie *InvalidError
	ok := errors.As(err, &ie)
	return ie, ok
}
