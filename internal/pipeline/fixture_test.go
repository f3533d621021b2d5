package pipeline_test

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
)

// fixture is a test's own database and the helpers that query it; the
// tests of a concern add the rows they need as methods.
type fixture struct{ *fixtures.DBTest }

func newFixture(t *testing.T) *fixture { return &fixture{fixtures.NewDBTest(t)} }

// tracedIntake is a pool of the test's database whose round trips trips
// counts, its connections already opened (a new one's setup is not
// intake's), and an insert-only River client on it.
func (f *fixture) tracedIntake(trips *testcontainers.RoundTrips) (*pgxpool.Pool, *river.Client[pgx.Tx]) {
	f.T.Helper()
	pool := f.DB.TracedPool(f.T, trips)
	if err := pool.Ping(f.Ctx); err != nil {
		f.T.Fatal(err)
	}
	ins, err := river.NewClient(riverpgxv5.New(pool), &river.Config{})
	if err != nil {
		f.T.Fatal(err)
	}
	return pool, ins
}

// holdLease makes owner the holder of the listener lease for the next
// hour.
func (f *fixture) holdLease(owner string) {
	f.T.Helper()
	f.Exec(`INSERT INTO mefor_leader_lease (key, owner, expires_at) VALUES ($1, $2, now() + interval '1 hour')`,
		leader.ListenerLeaseKey, owner)
}
