// Package sink is an MLLP receiver for demos, tests and benchmarks: it
// answers every message with a real ACK and optionally keeps each one as a
// file. `mefor sink` runs it; anything else that needs a partner to send
// to (a console's test receiver, say) can run the same one.
package sink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

// ShutdownTimeout is how long Serve waits for connections to finish once
// its context ends. Defaults to 10s.
const ShutdownTimeout = 10 * time.Second

// Config configures a Sink.
type Config struct {
	// Dir, when set, keeps each message as Dir/<n>-<control id>.hl7.
	// Defaults to keeping nothing.
	Dir string
	// Ack is the code every parsed message is answered with. Defaults to
	// AA; AE or AR exercise a sender's retries.
	Ack hl7.AckCode
	// Delay is how long to wait before answering each message (a slow
	// partner). Defaults to none.
	Delay time.Duration
	// Report, when set, is called for each message after it is kept and
	// before it is answered, from the message's connection goroutine.
	Report func(Received)
	// Logger receives the failures to keep a message. Defaults to
	// discarding them.
	Logger *slog.Logger
}

// Received describes one message the sink answered.
type Received struct {
	// Seq numbers the messages from 1 in the order they arrived.
	Seq          int64
	ControlID    string
	MessageType  string
	TriggerEvent string
	// Peer is the subject of the sender's verified client certificate;
	// empty without one.
	Peer string
	// ParseErr is set for a message that did not parse; it was answered AR.
	ParseErr error
}

// Sink is an MLLP handler that acknowledges and keeps messages.
type Sink struct {
	cfg Config
	n   atomic.Int64
}

// New returns a Sink, creating cfg.Dir if it is set.
func New(cfg Config) (*Sink, error) {
	if cfg.Ack == "" {
		cfg.Ack = hl7.AckAccept
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Dir != "" {
		if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
			return nil, fmt.Errorf("create %s: %w", cfg.Dir, err)
		}
	}
	return &Sink{cfg: cfg}, nil
}

// Count returns how many messages the sink received.
func (s *Sink) Count() int64 { return s.n.Load() }

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// ServeMLLP answers one message: AR if it does not parse, AE if it could
// not be kept, else cfg.Ack after cfg.Delay. It answers nothing when ctx
// ends during the delay.
func (s *Sink) ServeMLLP(ctx context.Context, raw []byte, conn mllp.ConnInfo) []byte {
	seq := s.n.Add(1)
	msg, err := hl7.Parse(raw)
	if err != nil {
		s.report(Received{Seq: seq, ParseErr: err})
		return hl7.NewACKForUnparsed(raw, hl7.AckReject, "not a valid HL7 message", hl7.NewControlID(), time.Now())
	}
	if s.cfg.Dir != "" {
		name := fmt.Sprintf("%08d-%s.hl7", seq, unsafeName.ReplaceAllString(msg.ControlID(), "_"))
		if err := writeFileAtomic(filepath.Join(s.cfg.Dir, name), raw); err != nil {
			s.cfg.Logger.ErrorContext(ctx, "write message file", "error", err)
			return hl7.NewACK(msg, hl7.AckError, "receiver could not store the message", hl7.NewControlID(), time.Now())
		}
	}
	s.report(Received{Seq: seq, ControlID: msg.ControlID(), MessageType: msg.MessageType(),
		TriggerEvent: msg.TriggerEvent(), Peer: conn.PeerSubject()})
	if s.cfg.Delay > 0 {
		select {
		case <-time.After(s.cfg.Delay):
		case <-ctx.Done():
			return nil
		}
	}
	return hl7.NewACK(msg, s.cfg.Ack, "", hl7.NewControlID(), time.Now())
}

func (s *Sink) report(r Received) {
	if s.cfg.Report != nil {
		s.cfg.Report(r)
	}
}

// Serve answers the messages arriving on ln, over TLS when tlsCfg is set,
// until ctx ends; it then waits up to ShutdownTimeout for the connections
// to finish. It returns nil after a shutdown.
func (s *Sink) Serve(ctx context.Context, ln net.Listener, tlsCfg *tls.Config) error {
	srv := &mllp.Server{Logger: s.cfg.Logger, TLSConfig: tlsCfg, Handler: s}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-done; err != nil && !errors.Is(err, mllp.ErrServerClosed) {
		return err
	}
	return nil
}

// writeFileAtomic writes through a hidden temp file and a rename, so whoever
// watches the directory never reads a half-written message.
func writeFileAtomic(path string, data []byte) error {
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err := os.WriteFile(tmp, data, 0o640); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
