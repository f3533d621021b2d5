package engine_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/leader"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// BenchmarkIntakeTransactions measures what intake alone costs the database
// per message: committed transactions (pg_stat_database) and client round
// trips (a pgx tracer counting queries and batches sent), with the listener
// lease checked as a serving node does. Only intake runs: the River client
// inserts drainers but works nothing, so every count is intake's. These are
// deterministic measures, unlike times on a shared machine.
//
//	go test -run='^$' -bench=BenchmarkIntakeTransactions -benchtime=1x ./internal/engine/
func BenchmarkIntakeTransactions(b *testing.B) {
	for _, sc := range []struct {
		name              string
		channels, senders int // senders per channel, each synchronous
		messages          int // per sender
	}{
		{name: "1conn", channels: 1, senders: 1, messages: 500},
		{name: "8channels", channels: 8, senders: 1, messages: 250},
		{name: "1channel-8conns", channels: 1, senders: 8, messages: 250},
	} {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				xacts, trips, total := runIntakeScenario(b, sc.channels, sc.senders, sc.messages)
				b.ReportMetric(float64(xacts)/float64(total), "xacts/msg")
				b.ReportMetric(float64(trips)/float64(total), "round_trips/msg")
				fmt.Printf("BENCH intake-%s messages=%d db_xacts_per_msg=%.3f round_trips_per_msg=%.3f\n",
					sc.name, total, float64(xacts)/float64(total), float64(trips)/float64(total))
			}
		})
	}
}

// tripCounter counts a connection's round trips (testcontainers.RoundTrips);
// the engine's tests embed it in tracers that look into some of them.
type tripCounter = testcontainers.RoundTrips

type fixedGate struct{ owner string }

func (g fixedGate) Serving() bool { return true }
func (g fixedGate) Owner() string { return g.owner }

func runIntakeScenario(b *testing.B, channels, senders, perSender int) (xacts, trips int64, total int) {
	ctx := context.Background()
	db := testcontainers.NewDB(b)
	if _, err := db.Pool.Exec(ctx, `INSERT INTO mefor_leader_lease (key, owner, expires_at) VALUES ($1, 'bench', now() + interval '1 hour')`,
		leader.ListenerLeaseKey); err != nil {
		b.Fatal(err)
	}
	admin, err := pgx.Connect(ctx, db.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer admin.Close(ctx)
	// Lanes activated (their drainers inserted) before the counted window.
	warm := startIntake(b, db, channels, senders, nil)
	warm.send(b, channels, 1)
	warm.close(b, admin)

	before := dbXacts(b, admin)
	counter := &tripCounter{}
	run := startIntake(b, db, channels, senders, counter)
	b.ResetTimer()
	run.send(b, channels*senders, perSender)
	b.StopTimer()
	trips = counter.N.Load()
	polls := run.close(b, admin)
	total = channels * senders * perSender
	// The admin session's own reads are transactions too: the polls, the
	// flush and the first read.
	return dbXacts(b, admin) - before - int64(polls) - 2, trips, total
}

type intakeRig struct {
	pool  *pgxpool.Pool
	addrs []string
	srvs  []*mllp.Server
}

func startIntake(b *testing.B, db *testcontainers.DB, channels, senders int, tracer pgx.QueryTracer) *intakeRig {
	ctx := context.Background()
	pcfg, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		b.Fatal(err)
	}
	pcfg.ConnConfig.Tracer = tracer
	pcfg.ConnConfig.RuntimeParams["application_name"] = "intake-bench"
	pcfg.MaxConns = int32(channels*senders + 2)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: fixtures.Logger(b)})
	if err != nil {
		b.Fatal(err)
	}
	in := &engine.Intake{Pool: pool, Inserter: client, Logger: fixtures.Logger(b), Gate: fixedGate{owner: "bench"}}
	r := &intakeRig{pool: pool}
	for i := range channels {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		srv := &mllp.Server{Handler: in.MLLPHandler(&config.Channel{Name: fmt.Sprintf("ch%d", i)})}
		go srv.Serve(ln)
		r.srvs = append(r.srvs, srv)
		r.addrs = append(r.addrs, ln.Addr().String())
	}
	return r
}

// send runs n synchronous senders, sender i on channel i mod channels.
func (r *intakeRig) send(b *testing.B, n, perSender int) {
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range n {
		wg.Go(func() {
			c := &mllp.Client{Addr: r.addrs[i%len(r.addrs)], AckTimeout: 30 * time.Second}
			defer c.Close()
			for j := range perSender {
				raw, err := c.Send(context.Background(), adt(fmt.Sprintf("I%d-%d", i, j), fmt.Sprintf("P%d", j)))
				if ack, perr := hl7.ParseACK(raw); err != nil || perr != nil || ack.Code != hl7.AckAccept {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() > 0 {
		b.Fatalf("%d messages not acknowledged AA", failed.Load())
	}
}

// close stops the rig and waits until its sessions are gone: a backend
// flushes its statistics when it exits. It returns how many reads the
// admin session spent waiting.
func (r *intakeRig) close(b *testing.B, admin *pgx.Conn) int {
	for _, s := range r.srvs {
		_ = s.Shutdown(context.Background())
	}
	r.pool.Close()
	for polls := 1; ; polls++ {
		var n int
		if err := admin.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = 'intake-bench'`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n == 0 {
			return polls
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// dbXacts is the database's committed transaction count, with the admin
// session's own flushed first.
func dbXacts(b *testing.B, admin *pgx.Conn) int64 {
	ctx := context.Background()
	if _, err := admin.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		b.Fatal(err)
	}
	var n int64
	if err := admin.QueryRow(ctx, `SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()`).Scan(&n); err != nil {
		b.Fatal(err)
	}
	return n
}
