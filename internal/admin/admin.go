// Package admin serves a node's read-only admin HTTP endpoints: its health
// and the cluster's lease, leader and membership, as JSON, and its
// Prometheus metrics. Writes (replay,
// stepdown, ...) stay in the CLI, which needs only the database.
package admin

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/tlsconf"
	"github.com/mefor/mefor/ops"
)

// Server is the admin HTTP listener of one node.
type Server struct {
	Pool   *pgxpool.Pool
	NodeID string
	// Serving reports whether this node holds the listener lease.
	Serving func() bool
	// Certificates, when set, lists the certificates this node uses.
	Certificates func() []tlsconf.Certificate
	// Metrics, when set, serves GET /metrics (Prometheus text format).
	Metrics http.Handler
	Logger  *slog.Logger

	srv *http.Server
	ln  net.Listener
}

// Handler returns the endpoints:
//
//	GET /healthz          200 when the node runs and its database answers, else 503
//	GET /cluster/status   lease holder and expiry, River leader, node counts
//	GET /cluster/nodes    the node listing of `mefor nodes --json`
//	GET /certificates     the certificates this node loaded: file, subject, issuer, expiry, uses
//	GET /metrics          the node's Prometheus metrics, when Metrics is set
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	if s.Metrics != nil {
		mux.Handle("GET /metrics", s.Metrics)
	}
	mux.HandleFunc("GET /certificates", func(w http.ResponseWriter, r *http.Request) {
		certs := []tlsconf.Certificate{}
		if s.Certificates != nil {
			certs = append(certs, s.Certificates()...)
		}
		writeJSON(w, http.StatusOK, certs)
	})
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /cluster/status", func(w http.ResponseWriter, r *http.Request) {
		st, err := ops.GetClusterStatus(r.Context(), s.Pool)
		s.reply(w, st, err)
	})
	mux.HandleFunc("GET /cluster/nodes", func(w http.ResponseWriter, r *http.Request) {
		nodes, err := ops.ListNodes(r.Context(), s.Pool)
		if nodes == nil {
			nodes = []ops.Node{}
		}
		s.reply(w, nodes, err)
	})
	return mux
}

type health struct {
	Status     string `json:"status"`
	Node       string `json:"node"`
	HoldsLease bool   `json:"holds_lease"`
	Database   string `json:"database"`
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	h := health{Status: "ok", Node: s.NodeID, HoldsLease: s.Serving(), Database: "ok"}
	code := http.StatusOK
	if err := s.Pool.Ping(ctx); err != nil {
		h.Status, h.Database, code = "unavailable", "unreachable: "+err.Error(), http.StatusServiceUnavailable
	}
	writeJSON(w, code, h)
}

func (s *Server) reply(w http.ResponseWriter, v any, err error) {
	if err != nil {
		s.Logger.Warn("admin request failed", "error", err)
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, v)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// Start binds addr and serves in the background.
func (s *Server) Start(addr string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.Logger.Error("admin listener stopped", "error", err)
		}
	}()
	return nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stop closes the listener and waits for requests in flight, up to ctx.
func (s *Server) Stop(ctx context.Context) error {
	if s.srv == nil {
		return nil
	}
	return s.srv.Shutdown(ctx)
}
