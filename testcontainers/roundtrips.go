package testcontainers

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// RoundTrips is a pgx tracer (set it as a pool's ConnConfig.Tracer) that
// counts what a connection sends to the server: each query (BEGIN and
// COMMIT included) and each batch is one round trip. Tests that assert a
// cost in round trips embed it and override the methods they look into.
type RoundTrips struct{ N atomic.Int64 }

func (r *RoundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	r.N.Add(1)
	return ctx
}
func (r *RoundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (r *RoundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	r.N.Add(1)
	return ctx
}
func (r *RoundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (r *RoundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
