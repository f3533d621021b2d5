package notify

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/tlsconf"
)

// Transport is how a sink connects.
type Transport struct {
	// Egress checks every connection the sink makes; nil lets every
	// connection through (a config without egress:).
	Egress *egress.Policy
	// TLS is the configuration of the sink's tls: block as loaded (package
	// tlsconf); nil means the system's roots, TLS 1.2 or later, and the
	// host of the sink's address as the name its certificate must carry.
	TLS *tls.Config
}

// TransportOf is sink's transport under policy p with the TLS
// configurations of set (nil: none loaded).
func TransportOf(p *egress.Policy, set *tlsconf.Set, sink string) Transport {
	t := Transport{Egress: p}
	if set != nil {
		if c := set.AlertSinkClient(sink); c != nil {
			t.TLS = c.Config()
		}
	}
	return t
}

// Target is how an alert sink is named in egress refusals and in
// mefor_egress_refused_total.
func Target(sink string) string { return "alert_sink:" + sink }

// Sender sends notifications.
type Sender struct {
	// Logger receives a log sink's lines.
	Logger *slog.Logger
	// Transport returns how a sink connects; nil connects without an
	// egress policy or a tls: block.
	Transport func(sink *config.AlertSink) Transport
	// Hostname names the sending node: a syslog message's HOSTNAME.
	Hostname string
}

// Send delivers payload, a Notification as JSON, to sink. A log sink never
// fails; the others return an error naming the receiver's host and what
// went wrong, for the caller to retry.
func (s *Sender) Send(ctx context.Context, sink *config.AlertSink, payload []byte) error {
	var n Notification
	if err := json.Unmarshal(payload, &n); err != nil {
		return fmt.Errorf("alert notification to sink %s does not decode: %w", sink.Name, err)
	}
	var t Transport
	if s.Transport != nil {
		t = s.Transport(sink)
	}
	switch {
	case sink.Log != nil:
		s.log(ctx, sink, &n)
		return nil
	case sink.Webhook != nil:
		return postWebhook(ctx, WebhookClient(t, sink), sink.Webhook, payload)
	case sink.Email != nil:
		return sendMail(ctx, t, sink, &n)
	case sink.Syslog != nil:
		return sendSyslog(ctx, t, sink, &n, s.Hostname)
	}
	return errors.New("alert sink " + sink.Name + " has no kind")
}

func (s *Sender) log(ctx context.Context, sink *config.AlertSink, n *Notification) {
	level := slog.LevelWarn
	_ = level.UnmarshalText([]byte(sink.Log.Level))
	logger := s.Logger
	if logger == nil {
		logger = slog.Default()
	}
	attrs := []any{"rule", n.Rule, "sink", sink.Name, "state", n.State, "condition", n.Condition,
		"value", n.Value, "threshold", n.Threshold, "unit", n.Unit, "since", n.Since, "summary", n.Summary}
	switch {
	case n.AuditForward != "":
		attrs = append(attrs, "audit_forward", n.AuditForward)
	case n.Destination != "":
		attrs = append(attrs, "destination", n.Destination)
	case n.Channel != "":
		attrs = append(attrs, "channel", n.Channel)
	}
	logger.Log(ctx, level, "alert "+n.State, attrs...)
}

// tlsFor is the TLS configuration to reach address: t's, or the system's
// roots, with the address's host as the server name when none is set.
func tlsFor(t Transport, address string) *tls.Config {
	tc := t.TLS
	if tc == nil {
		tc = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	if tc.ServerName == "" {
		tc = tc.Clone()
		tc.ServerName, _, _ = net.SplitHostPort(address)
	}
	return tc
}
