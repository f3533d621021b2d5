package main

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/sink"
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

func (c *sinkCmd) Run(ctx context.Context, g *Globals) error {
	snk, err := sink.New(sink.Config{Dir: c.Dir, Ack: hl7.AckCode(c.Ack), Delay: c.Delay, Logger: g.logger,
		Report: func(r sink.Received) {
			switch {
			case r.ParseErr != nil:
				fmt.Fprintf(g.stdout, "%d\t-\tunparseable (%v)\n", r.Seq, r.ParseErr)
			case !c.Quiet:
				from := ""
				if r.Peer != "" {
					from = "\tfrom " + r.Peer
				}
				fmt.Fprintf(g.stdout, "%d\t%s\t%s^%s%s\n", r.Seq, r.ControlID, r.MessageType, r.TriggerEvent, from)
			}
		}})
	if err != nil {
		return err
	}
	tlsCfg, err := c.TLS.config()
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", c.Listen, err)
	}
	g.logger.Info("sink listening", "addr", ln.Addr().String(), "dir", c.Dir, "ack", c.Ack,
		"tls", tlsCfg != nil, "client_certificates", tlsCfg != nil && tlsCfg.ClientCAs != nil)
	if err := snk.Serve(ctx, ln, tlsCfg); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "received %d messages\n", snk.Count())
	return nil
}
