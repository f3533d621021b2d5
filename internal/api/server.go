// Package api is mefor's HTTPS operator API: login and sessions
// (POST /api/v1/login, /api/v1/logout, GET /api/v1/me, POST
// /api/v1/reauth), single sign-on with OpenID Connect (GET
// /api/v1/sso/login and /api/v1/sso/callback: the code flow with PKCE,
// sso.go; GET /api/v1/sso/reauth re-authenticates an SSO person's session
// through the provider), the reads (status, nodes, alerts, messages) and the actions
// (replay, replay-dead, cancel, stepdown, keys rotate), each scoped to the
// person's channels, with dual control for the actions access.approvals
// names (approvals.go), and user and token administration (admin.go),
// which, like stepdown and keys rotate, needs a fresh re-authentication. It authenticates through package identity and
// serves on a listener gated by package admission, like the MLLP
// listeners: a source outside the allow list, or over a cap, is closed
// before a byte of it is read.
//
// A node serves it when its config has an api: section (engine.startAPI).
package api

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/identity"
)

// Config is one API listener.
type Config struct {
	// Listen is the address to listen on, host:port.
	Listen string
	// CertFile and KeyFile are the server's certificate and key (PEM).
	// Without them the API serves plain HTTP, which Check allows only on
	// a loopback address or with Plaintext.
	CertFile, KeyFile string
	// Plaintext allows plain HTTP on an address other machines can reach,
	// for a trusted network (or a TLS-terminating proxy on the same host
	// would listen on loopback instead). Defaults to false.
	Plaintext bool
	// Admission is which sources may connect and how many connections are
	// held. Defaults to any source, without caps.
	Admission admission.Policy
	// LoginsPerMinute bounds the login attempts from one source address.
	// Defaults to 10.
	LoginsPerMinute int
	// Reads serves the read endpoints (status, nodes, alerts, messages).
	// Defaults to none: without it they answer 404.
	Reads Reads
	// Actions serves the action endpoints (replay, replay-dead, cancel,
	// stepdown, keys rotate) and re-authentication. Defaults to none: without it they
	// answer 404.
	Actions Actions
	// Approvals is dual control for the actions. Defaults to none.
	Approvals Approvals
	// SSO is the OpenID Connect provider people may log in through
	// (GET /api/v1/sso/login). Defaults to none: passwords only.
	SSO *OIDC
	// AlertChannel names the channel an alert rule watches ("" for a rule
	// on a destination or an audit forward target), and whether the rule
	// is known, so a person with a channel scope sees only the alerts of
	// their channels. Defaults to none: such a person sees no alert.
	AlertChannel func(rule string) (channel string, known bool)
	// Console builds the handler served at / (every path outside /api/)
	// from the API's own handler: the operator console, package console,
	// which reads and acts only through the API. Defaults to none: paths
	// outside /api/ answer 404.
	Console func(api http.Handler) http.Handler
}

// ErrPlaintextExposed is a listener other machines can reach without TLS
// and without plaintext: true.
var ErrPlaintextExposed = errors.New("would serve the API in plain HTTP to the network, where anyone on the path can read passwords and session cookies")

// exposed reports whether listen is reachable from other machines: any
// address that is not loopback (a wildcard or a host name included).
func exposed(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		host = listen
	}
	if strings.EqualFold(host, "localhost") {
		return false
	}
	ip := net.ParseIP(host)
	return ip == nil || !ip.IsLoopback()
}

// Check refuses a config that would expose plain HTTP, or names half a
// certificate pair.
func (c Config) Check() error {
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("api.tls: give both cert_file and key_file")
	}
	if c.CertFile != "" && c.Plaintext {
		return errors.New("api: plaintext: true and a tls: block; remove one")
	}
	if c.CertFile == "" && !c.Plaintext && exposed(c.Listen) {
		return fmt.Errorf("api.listen: %s %w; add tls: {cert_file, key_file}, listen on a loopback address (127.0.0.1), "+
			"or set plaintext: true on a trusted network", c.Listen, ErrPlaintextExposed)
	}
	return nil
}

// Server serves the API.
type Server struct {
	cfg     Config
	store   *identity.Store
	gate    *admission.Gate
	tls     *tls.Config
	logins  *limiter
	reads   Reads
	actions Actions
	// approvals is dual control (access.approvals).
	approvals Approvals
	sso       *sso
	// alertChannel is Config.AlertChannel.
	alertChannel func(rule string) (string, bool)
	logger       *slog.Logger
	handler      http.Handler
}

// New checks cfg, loads its certificate, and returns a server
// authenticating through store. refused, when set, counts the
// connections the gate refuses.
func New(cfg Config, store *identity.Store, logger *slog.Logger, refused func(admission.Reason)) (*Server, error) {
	if err := cfg.Check(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if cfg.LoginsPerMinute <= 0 {
		cfg.LoginsPerMinute = 10
	}
	s := &Server{cfg: cfg, store: store, logger: logger, reads: cfg.Reads, actions: cfg.Actions, approvals: cfg.Approvals,
		alertChannel: cfg.AlertChannel,
		gate:         admission.NewGate(cfg.Admission, admission.Options{Refused: refused, Logger: logger}),
		logins:       newLimiter(cfg.LoginsPerMinute, time.Minute)}
	if cfg.SSO != nil {
		s.sso = newSSO(*cfg.SSO)
	}
	if cfg.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(cfg.CertFile, cfg.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("api.tls: load %s and %s: %w", cfg.CertFile, cfg.KeyFile, err)
		}
		s.tls = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	}
	s.handler = s.routes()
	return s, nil
}

// Handler is the API's HTTP handler, without the listener's admission
// and TLS.
func (s *Server) Handler() http.Handler { return s.handler }

// TLS reports whether the server serves HTTPS.
func (s *Server) TLS() bool { return s.tls != nil }

// Listen opens the API's listener: admission's gate first, so a refused
// connection is closed before its TLS handshake, then TLS.
func (s *Server) Listen() (net.Listener, error) {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("api: listen on %s: %w", s.cfg.Listen, err)
	}
	gated := s.gate.Listener(ln)
	if s.tls != nil {
		return tls.NewListener(gated, s.tls), nil
	}
	return gated, nil
}

// Serve serves ln (from Listen) until ctx ends, then shuts down, giving
// requests in flight five seconds.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{Handler: s.handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = hs.Shutdown(sctx)
		case <-done:
		}
	}()
	err := hs.Serve(ln)
	close(done)
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
