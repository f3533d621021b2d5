package migrations_test

import (
	"context"
	"testing"

	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
)

// A database migrated by the release before gave operators table-wide
// INSERT and UPDATE on mefor_message and mefor_work; `mefor migrate` takes
// them back and leaves the columns replay, cancel and enqueue change.
func TestMigrateTakesBackOperatorsTableWideWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	// What the release before granted.
	if _, err := db.Pool.Exec(ctx, `GRANT INSERT, UPDATE ON mefor_message, mefor_work TO `+migrations.RoleOperator); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		sql  string
		args []any
		want bool
	}{
		{`SELECT has_table_privilege($1, 'mefor_work', 'UPDATE')`, nil, false},
		{`SELECT has_table_privilege($1, 'mefor_message', 'INSERT')`, nil, false},
		{`SELECT has_column_privilege($1, 'mefor_work', 'payload', 'UPDATE')`, nil, false},
		{`SELECT has_column_privilege($1, 'mefor_message', 'raw', 'UPDATE')`, nil, false},
		{`SELECT has_column_privilege($1, 'mefor_work', 'payload', 'INSERT')`, nil, false},
		{`SELECT has_column_privilege($1, 'mefor_work', 'status', 'UPDATE')`, nil, true},
		{`SELECT has_column_privilege($1, 'mefor_message', 'raw', 'INSERT')`, nil, true},
	} {
		var got bool
		if err := db.Pool.QueryRow(ctx, c.sql, append([]any{migrations.RoleOperator}, c.args...)...).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != c.want {
			t.Errorf("%s for the operator after migrating again: %v, want %v", c.sql, got, c.want)
		}
	}
}
