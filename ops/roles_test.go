package ops

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// The policy names the role each operation needs, reader when it says
// nothing; a refusal is recognised however deeply it is wrapped, and only
// a refusal.
func TestRolePolicyAndPermissionDenied(t *testing.T) {
	t.Parallel()
	for op, want := range map[Operation]string{
		OpReplay: RoleOperator, OpMessagesShowBody: RoleOperator, OpStepdown: RoleAdmin, OpKeysRotate: RoleAdmin,
		Operation("status"): RoleReader,
	} {
		if got := RequiredRole(op); got != want {
			t.Errorf("RequiredRole(%s) = %s, want %s", op, got, want)
		}
	}
	denied := fmt.Errorf("replay: %w", &pgconn.PgError{Code: "42501", Message: "permission denied for table mefor_work"})
	if !IsPermissionDenied(denied) {
		t.Errorf("a wrapped 42501 is not a permission refusal")
	}
	for _, err := range []error{nil, errors.New("permission denied"), &pgconn.PgError{Code: "40P01"}} {
		if IsPermissionDenied(err) {
			t.Errorf("IsPermissionDenied(%v) = true", err)
		}
	}
}
