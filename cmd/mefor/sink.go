package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync/atomic"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

type sinkCmd struct {
	Listen string        `required:"" placeholder:"HOST:PORT" help:"Address to listen on."`
	Dir    string        `placeholder:"DIR" help:"Write each message to DIR/<n>-<control id>.hl7 (default: don't write)."`
	Ack    string        `default:"AA" enum:"AA,AE,AR" help:"ACK code to answer with (AE/AR to exercise a sender's retries)."`
	Delay  time.Duration `placeholder:"DURATION" help:"Wait this long before answering each message (a slow partner, e.g. to cancel during a send)."`
	Quiet  bool          `help:"Do not print a line per message."`
	TLS    serverTLS     `embed:""`
}

func (c *sinkCmd) Help() string {
	return `An MLLP receiver for demos, tests and benchmarks: answers every message with
a real ACK and optionally keeps it as a file. Prints "<n> <control id> <type>"
per message. Stops on Ctrl-C.

Examples:
  mefor sink --listen 127.0.0.1:2576
  mefor sink --listen 127.0.0.1:2576 --dir ./out/sink
  mefor sink --listen 127.0.0.1:2576 --delay 3s

Over TLS, requiring senders to present a certificate signed by ca.crt (each
message line then ends with the sender's certificate subject):
  mefor sink --listen 127.0.0.1:2576 --tls-cert sink.crt --tls-key sink.key --tls-client-ca ca.crt`
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

func (c *sinkCmd) Run(ctx context.Context, g *Globals) error {
	if c.Dir != "" {
		if err := os.MkdirAll(c.Dir, 0o750); err != nil {
			return fmt.Errorf("create %s: %w", c.Dir, err)
		}
	}
	tlsCfg, err := c.TLS.config()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Listen, err)
	}
	var n atomic.Int64
	srv := &mllp.Server{
		Logger:    g.logger,
		TLSConfig: tlsCfg,
		Handler: mllp.HandlerFunc(func(ctx context.Context, raw []byte, conn mllp.ConnInfo) []byte {
			seq := n.Add(1)
			msg, err := hl7.Parse(raw)
			if err != nil {
				fmt.Fprintf(g.stdout, "%d\t-\tunparseable (%v)\n", seq, err)
				return hl7.NewACKForUnparsed(raw, hl7.AckReject, "not a valid HL7 message", hl7.NewControlID(), time.Now())
			}
			if c.Dir != "" {
				name := fmt.Sprintf("%08d-%s.hl7", seq, unsafeName.ReplaceAllString(msg.ControlID(), "_"))
				if err := writeFileAtomic(filepath.Join(c.Dir, name), raw); err != nil {
					g.logger.Error("write message file", "error", err)
					return hl7.NewACK(msg, hl7.AckError, "receiver could not store the message", hl7.NewControlID(), time.Now())
				}
			}
			if !c.Quiet {
				from := ""
				if peer := conn.PeerSubject(); peer != "" {
					from = "\tfrom " + peer
				}
				fmt.Fprintf(g.stdout, "%d\t%s\t%s^%s%s\n", seq, msg.ControlID(), msg.MessageType(), msg.TriggerEvent(), from)
			}
			if c.Delay > 0 {
				select {
				case <-time.After(c.Delay):
				case <-ctx.Done():
					return nil
				}
			}
			return hl7.NewACK(msg, hl7.AckCode(c.Ack), "", hl7.NewControlID(), time.Now())
		}),
	}
	g.logger.Info("sink listening", "addr", ln.Addr().String(), "dir", c.Dir, "ack", c.Ack,
		"tls", tlsCfg != nil, "client_certificates", tlsCfg != nil && tlsCfg.ClientCAs != nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if err := <-done; err != nil && !errors.Is(err, mllp.ErrServerClosed) {
		return err
	}
	fmt.Fprintf(g.stdout, "received %d messages\n", n.Load())
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
