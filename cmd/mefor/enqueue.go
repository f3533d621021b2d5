package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/ops"
)

type enqueueCmd struct {
	Channel string   `required:"" placeholder:"NAME" help:"Channel to store the messages into."`
	Config  string   `type:"existingfile" placeholder:"FILE" help:"Config file to check the channel name against (recommended)."`
	Files   []string `arg:"" help:"Files of HL7 messages, or - for standard input."`
	JSON    bool     `name:"json" help:"Print the stored ids as JSON."`
}

func (c *enqueueCmd) Help() string {
	return `Stores each message exactly as an inbound listener would (message row,
received event, queued for routing, committed) and prints its message id, one
per line. A message that does not parse is stored with status error and
reported. Running nodes route and deliver it.

Examples:
  mefor enqueue --channel adt examples/quickstart/adt.hl7
  cat msg.hl7 | mefor enqueue --channel adt --config mefor.yaml -`
}

type enqueued struct {
	MessageID int64  `json:"message_id"`
	ControlID string `json:"control_id,omitempty"`
	Error     string `json:"error,omitempty"`
}

func (c *enqueueCmd) Run(ctx context.Context, g *Globals) error {
	var cfg *config.Config
	if c.Config != "" {
		var err error
		if cfg, err = config.Load(c.Config); err != nil {
			return err
		}
		if cfg.Channel(c.Channel) == nil {
			return fmt.Errorf("channel %q is not in %s", c.Channel, c.Config)
		}
	}
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
	kr, err := g.configKeyring(cfg)
	if err != nil {
		return err
	}
	pool, err := g.pool(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	enq := ops.NewEnqueuer(pool, kr)

	var out []enqueued
	bad := 0
	for _, raw := range msgs {
		rec, err := enq.Enqueue(ctx, c.Channel, raw)
		if err != nil {
			return fmt.Errorf("after %d stored: %w", len(out), err)
		}
		e := enqueued{MessageID: rec.MessageID, ControlID: rec.ControlID}
		if rec.ParseErr != nil {
			e.Error = rec.ParseErr.Error()
			bad++
		}
		out = append(out, e)
		if !c.JSON {
			if e.Error != "" {
				fmt.Fprintf(g.stdout, "%d\tstored with status error: %s\n", e.MessageID, e.Error)
			} else {
				fmt.Fprintf(g.stdout, "%d\n", e.MessageID)
			}
		}
	}
	if c.JSON {
		if err := writeJSON(g.stdout, out); err != nil {
			return err
		}
	}
	if bad > 0 {
		return &exitError{code: 1, err: fmt.Errorf("%d of %d messages did not parse (stored with status error)", bad, len(out))}
	}
	return nil
}
