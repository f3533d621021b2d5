package migrations_test

import (
	"context"
	"sync"
	"testing"

	"github.com/mefor/mefor/migrations"
	"github.com/mefor/mefor/testcontainers"
)

func TestMain(m *testing.M) { testcontainers.Main(m) }

func TestMigrateFromEmpty(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t, testcontainers.Empty())

	pending, err := migrations.Pending(ctx, db.Pool)
	if err != nil {
		t.Fatalf("Pending on empty database: %v", err)
	}
	if !pending {
		t.Fatal("empty database reports nothing pending")
	}

	res, err := migrations.Migrate(ctx, db.Pool, nil)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	all, err := migrations.All()
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Mefor) != len(all) {
		t.Fatalf("applied %d mefor migrations, want %d", len(res.Mefor), len(all))
	}
	if len(res.River) == 0 {
		t.Fatal("no River migrations applied on an empty database")
	}
	for _, table := range []string{"mefor_message", "mefor_work", "mefor_event", "mefor_response", "mefor_lane", "river_job"} {
		var exists bool
		if err := db.Pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists); err != nil {
			t.Fatal(err)
		}
		if !exists {
			t.Errorf("table %s missing after migrate", table)
		}
	}

	st, err := migrations.StatusOf(ctx, db.Pool)
	if err != nil {
		t.Fatalf("StatusOf: %v", err)
	}
	for _, s := range st {
		if !s.Applied {
			t.Errorf("%s migration %d (%s) not applied after Migrate", s.Line, s.Version, s.Name)
		}
	}

	again, err := migrations.Migrate(ctx, db.Pool, nil)
	if err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if len(again.River)+len(again.Mefor) != 0 {
		t.Fatalf("second Migrate applied %v, want nothing (idempotent)", again)
	}
}

// Two nodes starting at once both run migrate: neither may fail and the
// schema must end up applied exactly once.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testcontainers.NewDB(t, testcontainers.Empty())

	const runners = 4
	var wg sync.WaitGroup
	results := make([]*migrations.Result, runners)
	errs := make([]error, runners)
	for i := range runners {
		wg.Go(func() { results[i], errs[i] = migrations.Migrate(ctx, db.Pool, nil) })
	}
	wg.Wait()

	all, _ := migrations.All()
	applied := 0
	for i := range runners {
		if errs[i] != nil {
			t.Fatalf("runner %d: %v", i, errs[i])
		}
		applied += len(results[i].Mefor)
	}
	if applied != len(all) {
		t.Fatalf("mefor migrations applied %d times in total, want %d", applied, len(all))
	}
	var n int
	if err := db.Pool.QueryRow(ctx, "SELECT count(*) FROM mefor_migration").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != len(all) {
		t.Fatalf("mefor_migration has %d rows, want %d", n, len(all))
	}
}

func TestStatusOnEmptyDatabase(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t, testcontainers.Empty())
	st, err := migrations.StatusOf(context.Background(), db.Pool)
	if err != nil {
		t.Fatalf("StatusOf on empty database: %v", err)
	}
	if len(st) == 0 {
		t.Fatal("no migrations listed")
	}
	for _, s := range st {
		if s.Applied {
			t.Errorf("%s %d reported applied on an empty database", s.Line, s.Version)
		}
	}
}
