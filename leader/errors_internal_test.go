package leader

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestIsLeaseCheckRefusal: the lease check's division by zero is a lost
// lease; other database errors and the words alone are not.
func TestIsLeaseCheckRefusal(t *testing.T) {
	refusal := &pgconn.PgError{Code: "22012", Message: "division by zero"}
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{refusal, true},
		{fmt.Errorf("batch: %w", refusal), true},
		{&pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"}, false},
		{errors.New("division by zero"), false},
		{nil, false},
	} {
		if got := isLeaseCheckRefusal(tt.err); got != tt.want {
			t.Errorf("isLeaseCheckRefusal(%v) = %t, want %t", tt.err, got, tt.want)
		}
	}
}
