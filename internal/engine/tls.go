package engine

import (
	"context"
	"crypto/tls"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/tlsconf"
)

// Transport security.
//
// A node reads its certificate files when it is built and refuses to start
// if one is unusable (unreadable, not matching its key, expired), naming
// it. Each reload re-reads them all, even when the config file itself is
// unchanged, since a renewal changes only the certificate files: new
// handshakes and dials use the renewed ones, established connections carry
// on. The node records what it loaded, and how each channel listens, on
// its row in mefor_node_transport for `mefor status`, and warns once a day
// about certificates close to expiry.

// certCheckInterval is how often the expiry warner looks; it warns about a
// certificate at most once a day.
const certCheckInterval = time.Hour

// transport is the node's TLS state.
type transport struct {
	set    *tlsconf.Set
	warner *tlsconf.ExpiryWarner
	stop   context.CancelFunc
	done   chan struct{}
}

func (n *Node) loadTLS(cfg *config.Config) error {
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		return fmt.Errorf("not starting, a certificate is unusable:\n%w", err)
	}
	n.tls.set = set
	n.tls.warner = &tlsconf.ExpiryWarner{Window: cfg.TLSExpiryWarning, Logger: n.logger}
	n.senders.UseTLS(set)
	for _, c := range set.Certificates() {
		n.logger.Info("certificate in use", "file", c.File, "subject", c.Subject,
			"expires_at", c.NotAfter.UTC().Format(time.RFC3339), "uses", strings.Join(c.Uses, "; "))
	}
	return nil
}

// Certificates lists the certificates the node uses now.
func (n *Node) Certificates() []tlsconf.Certificate { return n.tls.set.Certificates() }

// serverTLS is the listener configuration of a channel, nil for plaintext.
func (n *Node) serverTLS(channel string) *tls.Config {
	if s := n.tls.set.Server(channel); s != nil {
		return s.TLSConfig()
	}
	return nil
}

// commitTLS puts staged certificates in use and logs the renewed files.
func (n *Node) commitTLS(ctx context.Context, certs *tlsconf.Staged) []string {
	renewed := certs.Commit()
	for _, f := range renewed {
		n.logger.InfoContext(ctx, "certificate file renewed: new connections use it", "file", f)
	}
	return renewed
}

// startCertWatch records the node's transport security and warns about
// expiring certificates now and every certCheckInterval until Stop.
func (n *Node) startCertWatch(ctx context.Context) {
	n.recordTransport(ctx)
	wctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	n.tls.stop, n.tls.done = stop, make(chan struct{})
	go func() {
		defer close(n.tls.done)
		t := time.NewTicker(certCheckInterval)
		defer t.Stop()
		for {
			n.checkCertExpiry(wctx)
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
		}
	}()
}

func (n *Node) stopCertWatch() {
	if n.tls.stop != nil {
		n.tls.stop()
		<-n.tls.done
	}
}

func (n *Node) checkCertExpiry(ctx context.Context) {
	n.tls.warner.Window = n.Config().TLSExpiryWarning
	n.tls.warner.Check(ctx, n.tls.set.Certificates(), time.Now())
}

// recordTransport writes the node's certificates and listeners to its row
// for `mefor status`. A failure is logged and left for the next reload or
// start: status is then out of date, nothing else.
func (n *Node) recordTransport(ctx context.Context) {
	cfg := n.Config()
	t := nodeinfo.Transport{Listeners: listenersOf(cfg)}
	for _, c := range n.tls.set.Certificates() {
		t.Certificates = append(t.Certificates, nodeinfo.NodeCertificate{
			File: c.File, Subject: c.Subject, Issuer: c.Issuer, Serial: c.Serial, NotAfter: c.NotAfter,
			WarnFrom: c.NotAfter.Add(-c.WarnWindow(cfg.TLSExpiryWarning)), Uses: c.Uses,
		})
	}
	if err := nodeinfo.RecordTransport(ctx, n.opts.Pool, n.opts.NodeID, t); err != nil {
		n.logger.WarnContext(ctx, "could not record the certificates in use for mefor status", "error", err)
	}
	if err := nodeinfo.RecordEncryption(ctx, n.opts.Pool, n.opts.NodeID, n.opts.Keys); err != nil {
		n.logger.WarnContext(ctx, "could not record the encryption keys in use for mefor status", "error", err)
	}
	if err := nodeinfo.RecordEgress(ctx, n.opts.Pool, n.opts.NodeID, egressOf(cfg)); err != nil {
		n.logger.WarnContext(ctx, "could not record the egress in force for mefor status", "error", err)
	}
	n.recordRetention(ctx)
}

// sameListener reports whether a reload may keep a listener bound with a
// as it is for b. plaintext: true only allows what the listener already
// does, so acknowledging a plaintext listener does not rebind it (which
// would close its idle connections). Any other change rebinds it, so a
// narrower allow list, lower caps or allow_names apply to the connections
// already open too.
func sameListener(a, b *config.MLLPInbound) bool {
	x, y := *a, *b
	x.Plaintext, y.Plaintext = false, false
	return reflect.DeepEqual(x, y)
}

// listenersOf says how each channel of cfg listens.
func listenersOf(cfg *config.Config) []nodeinfo.NodeListener {
	var out []nodeinfo.NodeListener
	for _, ch := range cfg.Channels {
		in := ch.Inbound.MLLP
		if in == nil {
			continue
		}
		out = append(out, nodeinfo.NodeListener{
			Channel: ch.Name, Listen: in.Listen, TLS: in.TLS.Enabled, ClientAuth: in.TLS.ClientCAFile != "",
			Exposed: in.Exposed(), Acknowledged: in.Plaintext,
		})
	}
	return out
}
