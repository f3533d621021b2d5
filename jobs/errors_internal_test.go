package jobs

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestIsNoDrainerRaise: only the check's own cast failure is a missing
// drainer; the same SQLSTATE raised by another statement is not.
func TestIsNoDrainerRaise(t *testing.T) {
	raise := &pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "` + noDrainerMark + `ingress:adt"`}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{raise, true},
		{fmt.Errorf("batch: %w", raise), true},
		{&pgconn.PgError{Code: "22P02", Message: `invalid input syntax for type integer: "abc"`}, false},
		{&pgconn.PgError{Code: "XX000", Message: raise.Message}, false},
		{errors.New(raise.Message), false},
		{nil, false},
	} {
		if got := isNoDrainerRaise(tt.err); got != tt.want {
			t.Errorf("isNoDrainerRaise(%v) = %t, want %t", tt.err, got, tt.want)
		}
	}
}
