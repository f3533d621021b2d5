package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

type sendCmd struct {
	To         string        `required:"" placeholder:"HOST:PORT" help:"MLLP listener to send to."`
	Files      []string      `arg:"" help:"Files of HL7 messages (- for standard input). Each segment starting with MSH begins a message."`
	Count      int           `help:"Send this many messages in total, cycling through the files (default: each message once)."`
	Rate       float64       `help:"Messages per second (default: as fast as ACKs come back)."`
	UniqueIDs  bool          `name:"unique-ids" help:"Give every message sent a fresh MSH-10 control id (for load tests that cycle a file)."`
	AckTimeout time.Duration `name:"ack-timeout" default:"30s" help:"How long to wait for each ACK."`
	Quiet      bool          `help:"Print only the summary line."`
	TLS        clientTLS     `embed:""`
}

func (c *sendCmd) Help() string {
	return `Sends each message over one MLLP connection and prints one line per message:
its number, its control id (MSH-10) and the ACK code (AA, AE, AR, or the
transport error). Exits 1 if any message did not get AA.

Examples:
  mefor send --to 127.0.0.1:2575 examples/quickstart/adt.hl7
  mefor send --to 127.0.0.1:2575 --count 10000 --rate 500 --unique-ids --quiet examples/quickstart/adt.hl7

Over TLS, verifying the listener with a private CA and presenting a client
certificate (a listener with client_ca_file requires one); a handshake that
fails is reported as "tls" with the reason on standard error:
  mefor send --to mefor.example.org:2575 --tls-ca ca.crt --tls-cert sender.crt --tls-key sender.key adt.hl7`
}

func (c *sendCmd) Run(ctx context.Context, g *Globals) error {
	var msgs [][]byte
	for _, f := range c.Files {
		data, err := readInput(f)
		if err != nil {
			return err
		}
		msgs = append(msgs, hl7.SplitMessages(data)...)
	}
	if len(msgs) == 0 {
		return errors.New("no HL7 messages found in the input (a message starts with a segment beginning MSH)")
	}
	total := c.Count
	if total <= 0 {
		total = len(msgs)
	}

	client := &mllp.Client{Addr: c.To, AckTimeout: c.AckTimeout}
	tlsCfg, err := c.TLS.config()
	if err != nil {
		return err
	}
	if tlsCfg != nil {
		client.Dialer = mllp.TLSDialer(func() *tls.Config { return tlsCfg })
	}
	defer client.Close()
	var tick <-chan time.Time
	if c.Rate > 0 {
		t := time.NewTicker(time.Duration(float64(time.Second) / c.Rate))
		defer t.Stop()
		tick = t.C
	}

	start := time.Now()
	counts := map[string]int{}
	failed := 0
	for i := range total {
		if tick != nil {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick:
			}
		}
		raw := msgs[i%len(msgs)]
		controlID := ""
		if m, err := hl7.Parse(raw); err == nil {
			if c.UniqueIDs {
				_ = m.Set("MSH-10", hl7.NewControlID())
				raw = m.Encode()
			}
			controlID = m.ControlID()
		}
		code, err := sendOne(ctx, client, raw)
		if err != nil && !c.Quiet {
			fmt.Fprintf(g.stderr, "message %d: %v\n", i+1, err)
		}
		counts[code]++
		if code != string(hl7.AckAccept) {
			failed++
		}
		if !c.Quiet {
			fmt.Fprintf(g.stdout, "%d\t%s\t%s\n", i+1, controlID, code)
		}
		if ctx.Err() != nil {
			break
		}
	}
	elapsed := time.Since(start)
	fmt.Fprintf(g.stdout, "sent %d messages in %s (%.0f/s): %v\n", total, elapsed.Round(time.Millisecond),
		float64(total)/elapsed.Seconds(), counts)
	if failed > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d of %d messages were not accepted (AA)", failed, total)}
	}
	return nil
}

// sendOne sends one message and names its outcome: the ACK code, or the
// class of transport failure with the error (which holds no message
// content).
func sendOne(ctx context.Context, c *mllp.Client, raw []byte) (string, error) {
	reply, err := c.Send(ctx, raw)
	var dial *mllp.DialError
	var hs *mllp.HandshakeError
	switch {
	case errors.As(err, &hs):
		return "tls", err
	case errors.As(err, &dial):
		return "refused", err
	case errors.Is(err, mllp.ErrAckTimeout):
		return "timeout", err
	case errors.Is(err, mllp.ErrConnClosed):
		return "closed", err
	case err != nil:
		return "error", err
	}
	ack, err := hl7.ParseACK(reply)
	if err != nil {
		return "bad-ack", nil
	}
	return string(ack.Code), nil
}

func readInput(name string) ([]byte, error) {
	if name == "-" {
		data, err := io.ReadAll(os.Stdin)
		if err != nil {
			return nil, fmt.Errorf("read standard input: %w", err)
		}
		return data, nil
	}
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	return data, nil
}
