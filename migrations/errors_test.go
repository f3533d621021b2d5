package migrations_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
)

// TestIsPermissionDeniedFromDatabase checks the predicate against the
// refusals themselves: the database's for a table the role has no
// privilege on, and RequireRole's for a role the session is not a member of.
func TestIsPermissionDeniedFromDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	// Roles are shared by every database of the server: name them after
	// this test's database.
	nobody, club := db.Name+"_nobody", db.Name+"_club"
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+nobody+" NOLOGIN; CREATE ROLE "+club+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP ROLE "+nobody+"; DROP ROLE "+club) })

	asNobody := func(fn func(tx pgx.Tx) error) error {
		return pgx.BeginFunc(ctx, db.Pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL ROLE "+nobody); err != nil {
				t.Fatal(err)
			}
			return fn(tx)
		})
	}
	err := asNobody(func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT count(*) FROM mefor_migration")
		return err
	})
	if !migrations.IsPermissionDenied(err) {
		t.Errorf("reading a table without privilege: migrations.IsPermissionDenied(%v) = false", err)
	}
	err = asNobody(func(tx pgx.Tx) error { return migrations.RequireRole(ctx, tx, club, "the example action") })
	if !migrations.IsPermissionDenied(err) {
		t.Errorf("RequireRole of a role the session lacks: migrations.IsPermissionDenied(%v) = false", err)
	}
	err = asNobody(func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "SELECT count(*) FROM no_such_table")
		return err
	})
	if err == nil || migrations.IsPermissionDenied(err) {
		t.Errorf("a missing table: migrations.IsPermissionDenied(%v) = true", err)
	}
}
