package migrations_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
)

// docs/security.md's table of who can read and write what is exact: each
// of its cells is what the database says the role holds after `mefor
// migrate`, and every column it does not name is readable by every mefor
// role and by nobody else.
func TestWhoCanReadWhatIsTheGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	nobody := fmt.Sprintf("nobody_%d", os.Getpid())
	if _, err := db.Pool.Exec(ctx, "CREATE ROLE "+nobody+" NOLOGIN"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Pool.Exec(context.Background(), "DROP OWNED BY "+nobody+"; DROP ROLE "+nobody) })
	roles := []string{migrations.RoleReader, migrations.RoleOperator, migrations.RoleAdmin, nobody}

	doc, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "### Who can read and write what")
	if !ok {
		t.Fatal("docs/security.md has no 'Who can read and write what' table")
	}
	ticked := regexp.MustCompile("`([a-z_]+(?:\\.[a-z_]+)?)`")
	named := map[string]bool{}
	rowsChecked := 0
	check := func(what, sql string, args []any, want map[string]bool) {
		t.Helper()
		for _, r := range roles {
			var got bool
			if err := db.Pool.QueryRow(ctx, sql, append([]any{r}, args...)...).Scan(&got); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got != want[r] {
				t.Errorf("%s for %s: the database says %v, docs/security.md says %v", what, r, got, want[r])
			}
		}
	}
	var otherCells map[string]bool
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if len(cells) != 5 || strings.Contains(cells[0], "---") || strings.TrimSpace(cells[0]) == "what" {
			if strings.HasPrefix(line, "#") || (rowsChecked > 0 && !strings.HasPrefix(line, "|")) {
				break
			}
			continue
		}
		want := map[string]bool{}
		for i, r := range roles {
			v := strings.TrimSpace(cells[i+1])
			if v != "read" && v != "yes" && v != "no" {
				t.Fatalf("docs/security.md: cell %q of %q is not read, yes or no", v, cells[0])
			}
			want[r] = v != "no"
		}
		what := strings.TrimSpace(cells[0])
		rowsChecked++
		switch {
		case strings.HasPrefix(what, "every other column"):
			otherCells = want
		case strings.HasPrefix(what, "write "):
			for _, m := range ticked.FindAllStringSubmatch(what, -1) {
				for _, priv := range []string{"INSERT", "UPDATE", "DELETE", "TRUNCATE"} {
					check(priv+" on "+m[1], `SELECT has_table_privilege($1, $2, $3)`, []any{m[1], priv}, want)
				}
			}
		case strings.HasPrefix(what, "change "):
			for _, m := range ticked.FindAllStringSubmatch(what, -1) {
				tbl, col, _ := strings.Cut(m[1], ".")
				check("UPDATE of "+m[1], `SELECT has_column_privilege($1, $2, $3, 'UPDATE')`, []any{tbl, col}, want)
			}
		case strings.HasPrefix(what, "call "):
			name := ticked.FindStringSubmatch(what)[1]
			var sig string
			if err := db.Pool.QueryRow(ctx, `SELECT oid::regprocedure::text FROM pg_proc WHERE proname = $1`, name).Scan(&sig); err != nil {
				t.Fatalf("function %s: %v", name, err)
			}
			check("EXECUTE on "+name, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, []any{sig}, want)
		default:
			for _, m := range ticked.FindAllStringSubmatch(what, -1) {
				tbl, col, ok := strings.Cut(m[1], ".")
				if !ok {
					// A table named alone: every one of its columns, and
					// its serial id's sequence.
					for _, c := range columnsOf(t, db, tbl) {
						named[tbl+"."+c] = true
						check("SELECT on "+tbl+"."+c, `SELECT has_column_privilege($1, $2, $3, 'SELECT')`, []any{tbl, c}, want)
					}
					var seq bool
					if err := db.Pool.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tbl+"_id_seq").Scan(&seq); err != nil {
						t.Fatal(err)
					}
					if seq {
						check("USAGE on "+tbl+"_id_seq", `SELECT has_sequence_privilege($1, $2, 'USAGE')`, []any{tbl + "_id_seq"}, want)
					}
					continue
				}
				named[m[1]] = true
				check("SELECT on "+m[1], `SELECT has_column_privilege($1, $2, $3, 'SELECT')`, []any{tbl, col}, want)
			}
		}
	}
	if rowsChecked < 5 || otherCells == nil {
		t.Fatalf("read %d rows of the table, and no 'every other column' row", rowsChecked)
	}
	rows, err := db.Pool.Query(ctx, `
		SELECT c.relname || '.' || a.attname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
		  AND (c.relname LIKE 'mefor\_%' OR c.relname LIKE 'river\_%') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	if rows.Err() != nil || len(cols) < 50 {
		t.Fatalf("%d columns, %v", len(cols), rows.Err())
	}
	for _, c := range cols {
		if named[c] {
			continue
		}
		tbl, col, _ := strings.Cut(c, ".")
		check("SELECT on "+c, `SELECT has_column_privilege($1, $2, $3, 'SELECT')`, []any{tbl, col}, otherCells)
	}
}

// columnsOf lists the columns of table; a table that does not exist fails
// the test, so the docs cannot name one that is gone.
func columnsOf(t *testing.T, db *testcontainers.DB, table string) []string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), `
		SELECT a.attname::text FROM pg_attribute a
		WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum`, table)
	if err != nil {
		t.Fatal(err)
	}
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	if rows.Err() != nil || len(cols) == 0 {
		t.Fatalf("docs/security.md names table %s, which has no columns (%v)", table, rows.Err())
	}
	return cols
}
