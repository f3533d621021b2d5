package rotation

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// Only a deadlock or a serialization failure makes a reseal batch worth
// running again.
func TestIsResealConflict(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{fmt.Errorf("batch: %w", &pgconn.PgError{Code: "40P01"}), true},
		{&pgconn.PgError{Code: "40001"}, true},
		{&pgconn.PgError{Code: "42501"}, false},
		{errors.New("deadlock detected"), false},
		{nil, false},
	} {
		if got := IsResealConflict(tc.err); got != tc.want {
			t.Errorf("IsResealConflict(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
