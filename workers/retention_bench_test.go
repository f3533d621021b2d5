package workers_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// BenchmarkRetention1M measures a retention pass over a million delivered
// messages (MEFOR_BENCH_MESSAGES overrides the count) and what it does to intake: the latency of storing a message
// (the ACK waits for that commit) with and without the pass running. Run it
// on its own:
//
//	go test -run '^$' -bench Retention1M -benchtime 1x -timeout 1h ./workers/
func BenchmarkRetention1M(b *testing.B) {
	n := fixtures.BenchMessages(1_000_000)
	ctx := context.Background()
	for range b.N {
		db := fixtures.BenchDB(b, func(db *testcontainers.DB) string {
			if err := populate(ctx, db.Pool, n, 40*24*time.Hour, 0); err != nil {
				b.Fatal(err)
			}
			return fmt.Sprintf("populated %d messages", n)
		})
		client := retentionNode(b, db.Pool, &config.Retention{KeepBodies: 30 * 24 * time.Hour, KeepDead: 30 * 24 * time.Hour, BatchSize: 5000})
		in := &engine.Intake{Pool: db.Pool, Inserter: fixtures.Inserter(b, db), Logger: slog.New(slog.DiscardHandler)}

		// intake sends from 4 senders until stop closes and returns the
		// latencies of storing each message.
		intake := func(stop <-chan struct{}) []time.Duration {
			var mu sync.Mutex
			var lat []time.Duration
			sendUntil(ctx, in, stop, func(_ engine.Received, took time.Duration, err error) bool {
				if err != nil {
					b.Error(err)
					return false
				}
				mu.Lock()
				lat = append(lat, took)
				mu.Unlock()
				return true
			})
			return lat
		}

		stop := make(chan struct{})
		time.AfterFunc(15*time.Second, func() { close(stop) })
		idle := intake(stop)

		stop = make(chan struct{})
		var during []time.Duration
		done := make(chan struct{})
		go func() { during = intake(stop); close(done) }()
		b.StartTimer()
		run := runRetention(b, db.Pool, client, time.Hour)
		b.StopTimer()
		close(stop)
		<-done

		b.Logf("retention: %s for %d messages (%v batches, bodies_nulled=%v), outcome %s",
			run.FinishedAt.Sub(run.StartedAt).Round(time.Millisecond), n, run.Detail["batches"], run.Detail["bodies_nulled"], run.Outcome)
		b.Logf("intake without retention: %s", percentiles(idle))
		b.Logf("intake during retention:  %s", percentiles(during))
	}
}

func percentiles(lat []time.Duration) string {
	if len(lat) == 0 {
		return "no messages"
	}
	slices.Sort(lat)
	at := func(p float64) time.Duration { return lat[int(p*float64(len(lat)-1))].Round(10 * time.Microsecond) }
	return fmt.Sprintf("%d messages, p50 %s, p99 %s, max %s", len(lat), at(0.50), at(0.99), lat[len(lat)-1].Round(10*time.Microsecond))
}
