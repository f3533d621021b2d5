package migrations_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// writeFunctions are the functions of migration 024 an operator changes
// the pipeline through, with arguments that would do something.
var writeFunctions = map[string]string{
	"mefor_replay":             `SELECT * FROM mefor_replay(1, 'u', 'h', '{}')`,
	"mefor_replay_dead":        `SELECT * FROM mefor_replay_dead('', '', 0, 1000, 10, 'u', 'h', '{}')`,
	"mefor_cancel":             `SELECT * FROM mefor_cancel('lab', '', false, 0, 1000, 10, 'u', 'h', '{}')`,
	"mefor_cancel_marked_idle": `SELECT * FROM mefor_cancel_marked_idle(ARRAY['outbound:lab'], 'u', 'h', '{}')`,
	"mefor_enqueue_id":         `SELECT mefor_enqueue_id()`,
	"mefor_enqueue":            `SELECT mefor_enqueue(NULL, 'adt', '', '', '', '', '', 3, 'MSH', '', NULL, 'u', 'h', '{}')`,
}

// helperFunctions are what the write functions call, as their owner; a
// login calling one itself could lock lanes, add drainer jobs, wake or
// finalize at will.
var helperFunctions = []string{
	`SELECT mefor_lock_lanes(ARRAY['ingress:adt'])`,
	`SELECT mefor_activate_lanes(ARRAY['ingress:adt'])`,
	`SELECT mefor_wake_lanes(ARRAY['ingress:adt'])`,
	`SELECT mefor_finalize(ARRAY[1::bigint])`,
	`SELECT mefor_lock_messages(ARRAY[1::bigint])`,
	`SELECT * FROM mefor_requeue(ARRAY[1::bigint], ARRAY['dead'])`,
	`SELECT * FROM mefor_cancel_work(ARRAY[1::bigint])`,
	`SELECT mefor_lock_drainers(ARRAY['ingress:adt'])`,
	`SELECT mefor_notify_queues(ARRAY['mefor_ingress'])`,
}

// A database migrated and granted by the release before (operators with
// INSERT and UPDATE on mefor_message and mefor_work, column by column and,
// older still, table-wide; INSERT on mefor_event and the count tables;
// INSERT and UPDATE on river_job and mefor_lane; nextval and setval on
// every sequence) loses every one of those writes when `mefor migrate`
// runs, which gives the operator the write functions instead; running it
// again changes nothing.
func TestMigrateTakesBackOperatorsWrites(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t, testcontainers.Empty())
	if _, err := migrations.MigrateTo(ctx, db.Pool, nil, 23); err != nil {
		t.Fatal(err)
	}
	if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	// What the releases before granted.
	fixtures.Exec(t, db, `
		GRANT INSERT, UPDATE ON mefor_message, mefor_work TO mefor_operator;
		GRANT INSERT (id, channel, raw, status), UPDATE (status, error) ON mefor_message TO mefor_operator;
		GRANT INSERT (message_id, stage, lane, channel), UPDATE (status, seq, attempts) ON mefor_work TO mefor_operator;
		GRANT INSERT ON mefor_event, mefor_message_count, mefor_work_count TO mefor_operator;
		GRANT INSERT, UPDATE ON river_job, mefor_lane TO mefor_operator;
		GRANT USAGE, SELECT, UPDATE ON SEQUENCE mefor_work_seq, river_job_id_seq TO mefor_operator`)
	for range 2 {
		if _, err := migrations.Migrate(ctx, db.Pool, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
			t.Fatal(err)
		}
		for _, role := range []string{migrations.RoleReader, migrations.RoleOperator} {
			rows, err := db.Pool.Query(ctx, `
				SELECT c.relname || ' ' || p.priv
				FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace,
					unnest(ARRAY['INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS p(priv)
				WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
				  AND (c.relname LIKE 'mefor\_%' OR c.relname LIKE 'river\_%')
				  AND (has_table_privilege($1, c.oid, p.priv)
				       OR (p.priv IN ('INSERT', 'UPDATE') AND has_any_column_privilege($1, c.oid, p.priv)))
				UNION ALL
				SELECT c.relname || ' ' || p.priv
				FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace, unnest(ARRAY['USAGE', 'UPDATE']) AS p(priv)
				WHERE n.nspname = current_schema() AND c.relkind = 'S' AND has_sequence_privilege($1, c.oid, p.priv)
				ORDER BY 1`, role)
			if err != nil {
				t.Fatal(err)
			}
			held, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatal(err)
			}
			if len(held) > 0 {
				t.Errorf("%s still holds after migrating: %s", role, strings.Join(held, ", "))
			}
		}
		for name := range writeFunctions {
			var sig string
			if err := db.Pool.QueryRow(ctx, `SELECT oid::regprocedure::text FROM pg_proc WHERE proname = $1`, name).Scan(&sig); err != nil {
				t.Fatalf("function %s: %v", name, err)
			}
			for role, want := range map[string]bool{migrations.RoleReader: false, migrations.RoleOperator: true} {
				var got bool
				if err := db.Pool.QueryRow(ctx, `SELECT has_function_privilege($1, $2, 'EXECUTE')`, role, sig).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s may call %s: %v, want %v", role, sig, got, want)
				}
			}
		}
	}
}

// refused reports whether err is the database refusing a privilege.
func refused(err error) bool { return migrations.IsPermissionDenied(err) }

// An operator login's own statements cannot write any of mefor's or
// River's tables, draw or set a sequence, or call the functions the write
// functions are built from; a reader login cannot call the write functions
// either. The operator's enqueue takes no id it did not draw.
func TestOperatorWritesOnlyThroughFunctions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	_, operator := fixtures.LoginPool(t, db, migrations.RoleOperator)
	_, reader := fixtures.LoginPool(t, db, migrations.RoleReader)

	rows, err := db.Pool.Query(ctx, `
		SELECT c.relname::text, (array_agg(a.attname::text ORDER BY a.attnum DESC))[1]
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
		WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')
		  AND (c.relname LIKE 'mefor\_%' OR c.relname LIKE 'river\_%')
		GROUP BY c.relname ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	type table struct{ name, col string }
	tables, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (table, error) {
		var tb table
		return tb, r.Scan(&tb.name, &tb.col)
	})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tb := range tables {
		names = append(names, tb.name)
	}
	for _, must := range []string{"mefor_message", "mefor_work", "mefor_event", "mefor_response", "mefor_state",
		"mefor_lane", "mefor_message_count", "mefor_work_count", "mefor_intake_file", "river_job"} {
		if !strings.Contains(" "+strings.Join(names, " ")+" ", " "+must+" ") {
			t.Fatalf("table %s not among %v", must, names)
		}
	}
	for _, tb := range tables {
		id := pgx.Identifier{tb.name}.Sanitize()
		for _, sql := range []string{
			"INSERT INTO " + id + " DEFAULT VALUES",
			"UPDATE " + id + " SET " + pgx.Identifier{tb.col}.Sanitize() + " = NULL WHERE false",
			"DELETE FROM " + id + " WHERE false",
			"TRUNCATE " + id,
		} {
			if _, err := operator.Exec(ctx, sql); !refused(err) {
				t.Errorf("operator: %s: %v; want permission denied", sql, err)
			}
		}
	}
	for _, sql := range []string{
		`SELECT nextval('mefor_work_seq')`, `SELECT setval('mefor_work_seq', 1)`,
		`SELECT nextval(pg_get_serial_sequence('mefor_message', 'id'))`, `SELECT nextval('river_job_id_seq')`,
	} {
		if _, err := operator.Exec(ctx, sql); !refused(err) {
			t.Errorf("operator: %s: %v; want permission denied", sql, err)
		}
	}
	for _, sql := range helperFunctions {
		if _, err := operator.Exec(ctx, sql); !refused(err) {
			t.Errorf("operator: %s: %v; want permission denied", sql, err)
		}
	}
	for name, sql := range writeFunctions {
		if _, err := reader.Exec(ctx, sql); !refused(err) {
			t.Errorf("reader: %s: %v; want permission denied", name, err)
		}
	}

	// Enqueue: only the id the session drew last, once; or one the
	// function draws.
	invalid := func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "22023"
	}
	conn, err := operator.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	enqueue := func(id int64) error {
		_, err := conn.Exec(ctx, `SELECT mefor_enqueue($1, 'adt', '', '', '', '', '', 3, 'MSH', '', NULL, 'u', 'h', '{}')`, id)
		return err
	}
	if err := enqueue(1); !invalid(err) {
		t.Errorf("operator enqueues under an id it did not draw: %v; want refused", err)
	}
	var drawn int64
	if err := conn.QueryRow(ctx, `SELECT mefor_enqueue_id()`).Scan(&drawn); err != nil {
		t.Fatal(err)
	}
	if err := enqueue(drawn + 1); !invalid(err) {
		t.Errorf("operator enqueues under an id ahead of the one it drew: %v; want refused", err)
	}
	if err := enqueue(drawn); err != nil {
		t.Fatalf("operator enqueues under the id it drew: %v", err)
	}
	if err := enqueue(drawn); err == nil {
		t.Errorf("operator enqueued twice under one id")
	}
	if _, err := conn.Exec(ctx, writeFunctions["mefor_enqueue"]); err != nil {
		t.Fatalf("operator enqueues under an id the function draws: %v", err)
	}
	var status string
	var ingress int64
	if err := db.Pool.QueryRow(ctx, `SELECT m.status, (SELECT count(*) FROM mefor_work w WHERE w.message_id = m.id AND w.lane = 'ingress:adt')
		FROM mefor_message m WHERE m.id = $1`, drawn).Scan(&status, &ingress); err != nil || status != "received" || ingress != 1 {
		t.Errorf("enqueued message %d: status %q, %d ingress rows (%v); want received with one", drawn, status, ingress, err)
	}
}

// Each operator write function appends its audit row in the caller's
// transaction, naming the login, whatever the caller does after: an
// operator calling one by hand leaves the same row mefor's commands do.
func TestOperatorWriteFunctionsAuditThemselves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t)
	if _, err := migrations.ApplyRoles(ctx, db.Pool, nil); err != nil {
		t.Fatal(err)
	}
	name, operator := fixtures.LoginPool(t, db, migrations.RoleOperator)
	var id int64
	if err := pgx.BeginFunc(ctx, operator, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT mefor_enqueue(NULL, 'adt', '', '', '', '', '', 3, 'MSH', '', NULL, 'u', 'h', '{"by": "hand"}')`).Scan(&id)
	}); err != nil {
		t.Fatal(err)
	}
	replay := func(p *pgxpool.Pool) {
		t.Helper()
		if _, err := p.Exec(ctx, `SELECT * FROM mefor_replay($1, 'u', 'h', '{}')`, id); err != nil {
			t.Fatal(err)
		}
	}
	replay(operator)
	rows, err := db.Pool.Query(ctx, `SELECT action, db_role, target::jsonb ->> 'message_id' FROM mefor_audit ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct{ action, role, msg string }
	got, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		return x, r.Scan(&x.action, &x.role, &x.msg)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []row{{"enqueue", name, strconv.FormatInt(id, 10)}, {"replay", name, strconv.FormatInt(id, 10)}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("audit rows %+v, want %+v", got, want)
	}
}
