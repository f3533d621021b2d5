package audit_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/mefor/mefor/internal/audit"
)

// TestFailureTellsDeniedFromFailed: a refusal for lack of privilege, however
// wrapped, is audited as denied; any other error, even one that says
// "permission denied" in its text, as failed.
func TestFailureTellsDeniedFromFailed(t *testing.T) {
	t.Parallel()
	denied := &pgconn.PgError{Code: "42501", Message: "permission denied for table mefor_message"}
	for _, tt := range []struct {
		err  error
		want string
	}{
		{denied, audit.OutcomeDenied},
		{fmt.Errorf("replay message 7: %w", denied), audit.OutcomeDenied},
		{&pgconn.PgError{Code: "23505", Message: "duplicate key"}, audit.OutcomeFailed},
		{errors.New("permission denied"), audit.OutcomeFailed},
	} {
		e := audit.Failure(audit.ActionReplay, map[string]any{"message_id": 7}, tt.err)
		if e.Outcome != tt.want {
			t.Errorf("Failure(%v).Outcome = %q, want %q", tt.err, e.Outcome, tt.want)
		}
		if e.Target["error"] != tt.err.Error() || e.Target["message_id"] != 7 {
			t.Errorf("Failure(%v).Target = %v", tt.err, e.Target)
		}
	}
}
