package migrations

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func TestErrorPredicates(t *testing.T) {
	t.Parallel()
	denied := &pgconn.PgError{Code: "42501", Message: "permission denied for table mefor_message"}
	concurrent := &pgconn.PgError{Code: "XX000", Message: "tuple concurrently updated"}
	for _, tt := range []struct {
		name                 string
		err                  error
		denied, concurrently bool
	}{
		{name: "nil"},
		{name: "database refusal", err: denied, denied: true},
		{name: "wrapped refusal", err: fmt.Errorf("grant: %w", denied), denied: true},
		{name: "roles step refused", err: &RolesError{Step: "create role", Err: denied}, denied: true},
		{name: "RequireRole refusal", err: permissionDenied("a maintenance run is for members of mefor_admin"), denied: true},
		{name: "other SQLSTATE", err: &pgconn.PgError{Code: "42P01", Message: "permission denied"}},
		{name: "only the words", err: errors.New("ERROR: permission denied for table mefor_message (SQLSTATE 42501)")},
		{name: "concurrent catalog update", err: fmt.Errorf("grant: %w", concurrent), concurrently: true},
		{name: "other internal error", err: &pgconn.PgError{Code: "XX000", Message: "cache lookup failed"}},
		{name: "concurrent update, only the words", err: errors.New("tuple concurrently updated")},
	} {
		if got := IsPermissionDenied(tt.err); got != tt.denied {
			t.Errorf("%s: IsPermissionDenied = %t, want %t", tt.name, got, tt.denied)
		}
		if got := isConcurrentCatalogUpdate(tt.err); got != tt.concurrently {
			t.Errorf("%s: isConcurrentCatalogUpdate = %t, want %t", tt.name, got, tt.concurrently)
		}
	}
}
