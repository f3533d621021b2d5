package ops

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestWithRetryRetriesOnlyAbortedTransactions: a deadlock or serialization
// failure, however wrapped, is run again (up to five times); any other
// error, even one naming a deadlock in its text, returns at once.
func TestWithRetryRetriesOnlyAbortedTransactions(t *testing.T) {
	deadlock := &pgconn.PgError{Code: "40P01", Message: "deadlock detected"}
	for _, tt := range []struct {
		err   error
		calls int
	}{
		{deadlock, 5},
		{fmt.Errorf("seal batch: %w", deadlock), 5},
		{&pgconn.PgError{Code: "40001", Message: "could not serialize access"}, 5},
		{&pgconn.PgError{Code: "23505", Message: "duplicate key"}, 1},
		{errors.New("deadlock detected"), 1},
		{nil, 1},
	} {
		calls := 0
		err := withRetry(func() error { calls++; return tt.err })
		if calls != tt.calls || !errors.Is(err, tt.err) {
			t.Errorf("withRetry(%v): %d calls returning %v, want %d calls", tt.err, calls, err, tt.calls)
		}
	}
}
