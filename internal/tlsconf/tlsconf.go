// Package tlsconf turns a config's TLS settings into the crypto/tls
// configurations a node's MLLP listeners, its MLLP and HTTP senders, its
// HTTP reference sources and its alert sinks use, and keeps them
// current.
//
// The certificate, key and CA files are read when a node starts (New) and
// again at each reload (Prepare, then Commit), all of them or none: a file
// that does not read, a key that does not match its certificate, or a
// certificate that has expired refuses the start or the reload with an
// error naming the config field and the file. A running listener asks for
// its configuration at each handshake (tls.Config.GetConfigForClient) and a
// sender at each dial, so renewed files apply to new connections while
// established ones carry on undisturbed.
//
// The package also lists the certificates in use (Certificates), for
// `mefor status` and the admin endpoint, and warns of those about to
// expire (ExpiryWarner).
package tlsconf

import (
	"bytes"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mefor/mefor/internal/admission"
	"github.com/mefor/mefor/internal/config"
)

// Certificate is one certificate a node uses.
type Certificate struct {
	File    string `json:"file"`
	Subject string `json:"subject"`
	Issuer  string `json:"issuer"`
	// Serial is the hex serial number, which tells a renewed certificate
	// from the one it replaces.
	Serial   string    `json:"serial"`
	NotAfter time.Time `json:"not_after"`
	// Uses says what the certificate serves as, e.g. `channel "adt" server
	// certificate` or `destination "lab" CA`; one file may serve several.
	Uses []string `json:"uses"`
	// CRL marks a certificate revocation list (a listener's crl_file),
	// listed here for its next update, by when it needs replacing as a
	// certificate does by its expiry (NotAfter).
	CRL bool `json:"crl,omitempty"`
}

// Server is one listener's TLS configuration.
type Server struct {
	cur atomic.Pointer[tls.Config]
	cfg *tls.Config
}

// TLSConfig is the configuration to give the listener (mllp.Server): it
// reads the current certificates at each handshake.
func (s *Server) TLSConfig() *tls.Config { return s.cfg }

func newServer(cur *tls.Config) *Server {
	s := &Server{}
	s.cur.Store(cur)
	s.cfg = &tls.Config{
		MinVersion: cur.MinVersion,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return s.cur.Load(), nil
		},
	}
	return s
}

// Client is one destination's TLS configuration.
type Client struct {
	cur atomic.Pointer[tls.Config]
}

// Config returns the configuration for a new connection.
func (c *Client) Config() *tls.Config { return c.cur.Load() }

// Set is every TLS configuration of a node, by channel, destination,
// reference set and alert sink. It is safe for concurrent use.
type Set struct {
	mu      sync.Mutex
	servers map[string]*Server
	clients map[clientKey]*Client
	certs   []Certificate
	sums    map[string]string // file → hash of its content at the last commit
}

// New reads every certificate, key and CA file cfg names, as of now.
// The error is a config.Errors naming each problem's field and file.
func New(cfg *config.Config, now time.Time) (*Set, error) {
	s := &Set{servers: map[string]*Server{}, clients: map[clientKey]*Client{}, sums: map[string]string{}}
	st, err := s.Prepare(cfg, now)
	if err != nil {
		return nil, err
	}
	st.Commit()
	return s, nil
}

// Server returns the channel's listener configuration, or nil when the
// channel listens in plaintext.
func (s *Set) Server(channel string) *Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.servers[channel]
}

// clientKey names what a client configuration is for: a config section
// (destinations, reference_sets, alerts) and a name in it.
type clientKey struct{ section, name string }

// Client returns the destination's configuration, or nil when it connects
// in plaintext.
func (s *Set) Client(destination string) *Client {
	return s.client(clientKey{"destinations", destination})
}

// ReferenceClient returns the configuration of the reference set's HTTP
// source, or nil when it has no tls: block (an https:// URL is then
// verified against the system's roots).
func (s *Set) ReferenceClient(set string) *Client { return s.client(clientKey{"reference_sets", set}) }

// AlertSinkClient returns the configuration of the alert sink's webhook,
// mail server (STARTTLS) or syslog receiver, or nil when it has none (a
// webhook without a tls: block is verified against the system's roots).
func (s *Set) AlertSinkClient(sink string) *Client { return s.client(clientKey{"alerts", sink}) }

// AuditForwardClient returns the configuration of an audit.forward target
// (syslog, always TLS, or webhook, nil without a tls: block).
func (s *Set) AuditForwardClient(target string) *Client { return s.client(clientKey{"audit", target}) }

func (s *Set) client(k clientKey) *Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clients[k]
}

// Certificates lists the certificates in use, soonest to expire first.
func (s *Set) Certificates() []Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.certs)
}

// Staged is a set of configurations read and checked, not yet in use.
type Staged struct {
	set     *Set
	servers map[string]*tls.Config
	clients map[clientKey]*tls.Config
	certs   []Certificate
	sums    map[string]string
}

// Prepare reads every file cfg names, as of now, and checks them, without
// changing what the set serves. The error is a config.Errors naming each
// problem's field and file.
func (s *Set) Prepare(cfg *config.Config, now time.Time) (*Staged, error) {
	l := &loader{cfg: cfg, now: now, files: map[string][]byte{}, inv: map[string]*Certificate{}}
	st := &Staged{set: s, servers: map[string]*tls.Config{}, clients: map[clientKey]*tls.Config{}}
	for _, ch := range cfg.Channels {
		if ch.Inbound.MLLP == nil || !ch.Inbound.MLLP.TLS.Enabled {
			continue
		}
		if tc := l.server(ch.Name, ch.Inbound.MLLP.TLS); tc != nil {
			st.servers[ch.Name] = tc
		}
	}
	client := func(k clientKey, t config.ClientTLS, base, use string) {
		if !t.Enabled {
			return
		}
		if tc := l.client(k, t, base, use); tc != nil {
			st.clients[k] = tc
		}
	}
	for _, d := range cfg.Destinations {
		t, base := d.ClientTLS()
		client(clientKey{"destinations", d.Name}, t, base, fmt.Sprintf("destination %q", d.Name))
	}
	for _, rs := range cfg.ReferenceSets {
		if h := rs.Source.HTTP; h != nil {
			client(clientKey{"reference_sets", rs.Name}, h.TLS, "source.http.tls.", fmt.Sprintf("reference set %q", rs.Name))
		}
	}
	if cfg.Alerts != nil {
		for _, sink := range cfg.Alerts.Sinks {
			k, use := clientKey{"alerts", sink.Name}, fmt.Sprintf("alert sink %q", sink.Name)
			switch {
			case sink.Webhook != nil:
				client(k, sink.Webhook.TLS, "sinks."+sink.Name+".webhook.tls.", use)
			case sink.Email != nil:
				client(k, sink.Email.TLS, "sinks."+sink.Name+".email.tls.", use)
			case sink.Syslog != nil:
				client(k, sink.Syslog.TLS, "sinks."+sink.Name+".syslog.tls.", use)
			}
		}
	}
	if f := cfg.Audit.Forward; f != nil {
		if sl := f.Syslog; sl != nil {
			client(clientKey{"audit", "syslog"}, sl.TLS, "forward.syslog.tls.", "audit.forward syslog")
		}
		if w := f.Webhook; w != nil {
			client(clientKey{"audit", "webhook"}, w.TLS, "forward.webhook.tls.", "audit.forward webhook")
		}
	}
	if len(l.errs) > 0 {
		return nil, l.errs
	}
	st.certs = l.inventory()
	st.sums = map[string]string{}
	for f, data := range l.files {
		sum := sha256.Sum256(data)
		st.sums[f] = hex.EncodeToString(sum[:])
	}
	return st, nil
}

// Commit puts the staged configurations in use: new handshakes and dials
// use them from now on. It returns the files whose content changed since
// the last commit (renewed certificates), sorted.
func (st *Staged) Commit() (renewed []string) {
	s := st.set
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, tc := range st.servers {
		if srv, ok := s.servers[name]; ok {
			srv.cur.Store(tc)
		} else {
			s.servers[name] = newServer(tc)
		}
	}
	for name := range s.servers {
		if _, ok := st.servers[name]; !ok {
			delete(s.servers, name)
		}
	}
	for name, tc := range st.clients {
		c, ok := s.clients[name]
		if !ok {
			c = &Client{}
			s.clients[name] = c
		}
		c.cur.Store(tc)
	}
	for name := range s.clients {
		if _, ok := st.clients[name]; !ok {
			delete(s.clients, name)
		}
	}
	renewed = st.renewedLocked()
	s.sums, s.certs = st.sums, st.certs
	return renewed
}

// Renewed lists the files whose content differs from the last commit,
// sorted: what Commit will report.
func (st *Staged) Renewed() []string {
	st.set.mu.Lock()
	defer st.set.mu.Unlock()
	return st.renewedLocked()
}

func (st *Staged) renewedLocked() []string {
	var renewed []string
	for f, sum := range st.sums {
		if old, ok := st.set.sums[f]; ok && old != sum {
			renewed = append(renewed, f)
		}
	}
	slices.Sort(renewed)
	return renewed
}

// loader reads the files of one Prepare, each once.
type loader struct {
	cfg   *config.Config
	now   time.Time
	files map[string][]byte
	errs  config.Errors
	inv   map[string]*Certificate // by file and serial
}

// field locates a problem: section and name of the entity, rel the key.
type field struct{ section, name, rel string }

func (l *loader) problem(f field, format string, args ...any) {
	l.errs = append(l.errs, l.cfg.Problem(f.section, f.name, f.rel, format, args...))
}

func (l *loader) server(channel string, t config.ServerTLS) *tls.Config {
	base := "inbound.mllp.tls."
	use := fmt.Sprintf("channel %q", channel)
	pair, ok := l.keyPair(field{"channels", channel, base + "cert_file"}, field{"channels", channel, base + "key_file"},
		t.CertFile, t.KeyFile, use+" server certificate")
	tc := &tls.Config{
		MinVersion: t.MinVersion,
		// MLLP connections are long-lived, so resumption saves little, and
		// a resumed session would skip verifying the client against a
		// client_ca_file that a reload has since changed.
		SessionTicketsDisabled: true,
	}
	if ok {
		tc.Certificates = []tls.Certificate{pair}
	}
	if t.ClientCAFile != "" {
		pool, cas := l.caPoolCerts(field{"channels", channel, base + "client_ca_file"}, t.ClientCAFile, use+" client CA")
		tc.ClientAuth, tc.ClientCAs = tls.RequireAndVerifyClientCert, pool
		ok = ok && pool != nil
		check := &admission.PeerCheck{}
		if len(t.AllowNames) > 0 {
			check.Names = admission.NewNames(t.AllowNames)
		}
		if t.CRLFile != "" {
			crls := l.revocationLists(field{"channels", channel, base + "crl_file"}, t.CRLFile, cas, use+" CRL")
			check.Revoked = admission.NewRevocations(crls)
			ok = ok && crls != nil
		}
		if check.Names != nil || check.Revoked != nil {
			tc.VerifyConnection = check.VerifyConnection
		}
	}
	if !ok {
		return nil
	}
	return tc
}

// client builds the configuration of a destination, reference source or
// webhook; base is the key of its tls: block below the entity (e.g.
// "mllp.tls."), or below the section when the entity has no name of its
// own in the file's paths (alert sinks: "sinks.ops.webhook.tls.").
func (l *loader) client(k clientKey, t config.ClientTLS, base, use string) *tls.Config {
	name := k.name
	if k.section == "alerts" || k.section == "audit" {
		name = ""
	}
	tc := &tls.Config{MinVersion: t.MinVersion, ServerName: t.ServerName}
	ok := true
	if t.CAFile != "" {
		tc.RootCAs = l.caPool(field{k.section, name, base + "ca_file"}, t.CAFile, use+" CA")
		ok = tc.RootCAs != nil
	}
	if t.CertFile != "" {
		pair, pok := l.keyPair(field{k.section, name, base + "cert_file"}, field{k.section, name, base + "key_file"},
			t.CertFile, t.KeyFile, use+" client certificate")
		if pok {
			tc.Certificates = []tls.Certificate{pair}
		}
		ok = ok && pok
	}
	if !ok {
		return nil
	}
	return tc
}

// read returns a file's content, reporting a file that does not read.
func (l *loader) read(f field, file string) ([]byte, bool) {
	if data, ok := l.files[file]; ok {
		return data, true
	}
	data, err := os.ReadFile(file)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		l.problem(f, "%s cannot be read: %v (paths are relative to mefor's working directory)", file, err)
		return nil, false
	}
	l.files[file] = data
	return data, true
}

// certificates parses the PEM certificates in data.
func (l *loader) certificates(f field, file string, data []byte) ([]*x509.Certificate, bool) {
	var certs []*x509.Certificate
	for rest := data; ; {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			l.problem(f, "%s holds a certificate that does not parse: %v", file, err)
			return nil, false
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		l.problem(f, "%s holds no PEM certificate (a block starting -----BEGIN CERTIFICATE-----)", file)
		return nil, false
	}
	return certs, true
}

// keyPair reads a certificate (with its chain) and its key. Every
// certificate in the chain must be valid now: a peer would refuse an
// expired one.
func (l *loader) keyPair(cf, kf field, certFile, keyFile, use string) (tls.Certificate, bool) {
	certPEM, ok := l.read(cf, certFile)
	if !ok {
		return tls.Certificate{}, false
	}
	chain, ok := l.certificates(cf, certFile, certPEM)
	if !ok {
		return tls.Certificate{}, false
	}
	for i, c := range chain {
		if l.now.After(c.NotAfter) {
			l.problem(cf, "%s: certificate %q expired on %s (%s ago); peers refuse it. Install a renewed certificate at that path, then start the node again (or run mefor reload)",
				certFile, c.Subject.String(), c.NotAfter.UTC().Format(time.RFC3339), age(l.now.Sub(c.NotAfter)))
			ok = false
		}
		u := use
		if i > 0 {
			u += " chain"
		}
		l.record(certFile, c, u)
	}
	keyPEM, kok := l.read(kf, keyFile)
	if !ok || !kok {
		return tls.Certificate{}, false
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		msg := err.Error()
		switch {
		case strings.Contains(msg, "does not match"):
			l.problem(kf, "%s is not the private key of the certificate in %s; give the key that was generated with it", keyFile, certFile)
		case strings.Contains(msg, "PEM data"), strings.Contains(msg, "PRIVATE KEY"):
			l.problem(kf, "%s holds no PEM private key (a block ending PRIVATE KEY-----); an encrypted key needs decrypting first", keyFile)
		default:
			l.problem(kf, "%s: %v", keyFile, err)
		}
		return tls.Certificate{}, false
	}
	return pair, true
}

// caPool reads a CA file. A bundle may hold expired CAs next to valid
// ones, but one that holds nothing valid would make every handshake fail.
func (l *loader) caPool(f field, file, use string) *x509.CertPool {
	pool, _ := l.caPoolCerts(f, file, use)
	return pool
}

// caPoolCerts is caPool that also returns the CA certificates, or nil
// when the file is unusable.
func (l *loader) caPoolCerts(f field, file, use string) (*x509.CertPool, []*x509.Certificate) {
	data, ok := l.read(f, file)
	if !ok {
		return nil, nil
	}
	certs, ok := l.certificates(f, file, data)
	if !ok {
		return nil, nil
	}
	pool := x509.NewCertPool()
	valid := 0
	for _, c := range certs {
		pool.AddCert(c)
		l.record(file, c, use)
		if !l.now.After(c.NotAfter) {
			valid++
		}
	}
	if valid == 0 {
		l.problem(f, "%s: every CA certificate in it has expired (the last on %s), so no peer can be verified; install the partner's current CA certificate",
			file, certs[0].NotAfter.UTC().Format(time.RFC3339))
		return nil, nil
	}
	return pool, certs
}

// revocationLists reads a CRL file: one or more lists, PEM ("X509 CRL"
// blocks) or a single DER list, each signed by one of cas (the listener's
// client CAs; nil when their file did not read, which is reported
// already). A list past its next update is still used, since the
// certificates it revokes stay revoked; it is listed with the
// certificates (its next update as its expiry), so the node, `mefor
// config check` and `mefor status` warn about it as about a certificate
// that needs renewing.
func (l *loader) revocationLists(f field, file string, cas []*x509.Certificate, use string) []*x509.RevocationList {
	data, ok := l.read(f, file)
	if !ok || cas == nil {
		return nil
	}
	var ders [][]byte
	if bytes.Contains(data, []byte("-----BEGIN")) {
		for rest := data; ; {
			var block *pem.Block
			block, rest = pem.Decode(rest)
			if block == nil {
				break
			}
			if block.Type == "X509 CRL" {
				ders = append(ders, block.Bytes)
			}
		}
		if len(ders) == 0 {
			l.problem(f, "%s holds no PEM revocation list (a block starting -----BEGIN X509 CRL-----)", file)
			return nil
		}
	} else {
		ders = [][]byte{data}
	}
	var lists []*x509.RevocationList
	for i, der := range ders {
		crl, err := x509.ParseRevocationList(der)
		if err != nil {
			l.problem(f, "%s: revocation list %d does not parse: %v (give the CA's CRL, PEM or DER)", file, i+1, err)
			return nil
		}
		signed := false
		for _, ca := range cas {
			if bytes.Equal(ca.RawSubject, crl.RawIssuer) && crl.CheckSignatureFrom(ca) == nil {
				signed = true
				break
			}
		}
		if !signed {
			l.problem(f, "%s: the revocation list of %q is not signed by a CA in client_ca_file, so it cannot be trusted; "+
				"give the CRL that CA publishes", file, crl.Issuer.String())
			return nil
		}
		l.recordCRL(file, crl, use)
		lists = append(lists, crl)
	}
	return lists
}

// recordCRL lists a revocation list with the certificates: its next
// update is when it needs replacing, as a certificate's expiry is.
func (l *loader) recordCRL(file string, crl *x509.RevocationList, use string) {
	serial := "crl"
	if crl.Number != nil {
		serial = "crl-" + crl.Number.Text(16)
	}
	key := file + "\x00" + serial
	inv, ok := l.inv[key]
	if !ok {
		next := crl.NextUpdate
		if next.IsZero() {
			next = farFuture
		}
		inv = &Certificate{File: file, Subject: "revocation list of " + crl.Issuer.String(), Issuer: crl.Issuer.String(),
			Serial: serial, NotAfter: next, CRL: true}
		l.inv[key] = inv
	}
	if !slices.Contains(inv.Uses, use) {
		inv.Uses = append(inv.Uses, use)
	}
}

// farFuture stands for a revocation list without a next update: it never
// needs replacing by its own account.
var farFuture = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)

func (l *loader) record(file string, c *x509.Certificate, use string) {
	serial := c.SerialNumber.Text(16)
	key := file + "\x00" + serial
	inv, ok := l.inv[key]
	if !ok {
		inv = &Certificate{File: file, Subject: c.Subject.String(), Issuer: c.Issuer.String(), Serial: serial, NotAfter: c.NotAfter}
		l.inv[key] = inv
	}
	if !slices.Contains(inv.Uses, use) {
		inv.Uses = append(inv.Uses, use)
	}
}

func (l *loader) inventory() []Certificate {
	out := make([]Certificate, 0, len(l.inv))
	for _, c := range l.inv {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Certificate) int {
		if c := a.NotAfter.Compare(b.NotAfter); c != 0 {
			return c
		}
		return strings.Compare(a.File+a.Serial, b.File+b.Serial)
	})
	return out
}

// age formats a span the way people say it, for messages about expiry.
func age(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
	case d >= 2*time.Hour:
		return fmt.Sprintf("%d hours", int(d/time.Hour))
	}
	return fmt.Sprintf("%d minutes", int(d/time.Minute))
}
