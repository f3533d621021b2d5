package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/egress"
	"github.com/mefor/mefor/internal/notify"
	"github.com/mefor/mefor/internal/tlsconf"
)

type alertsTestCmd struct {
	Sink   string `arg:"" help:"The sink's name under alerts.sinks."`
	Config string `required:"" type:"existingfile" placeholder:"FILE" help:"The config the nodes run: the sink's settings, its TLS files and egress.allow."`
}

func (c *alertsTestCmd) Help() string {
	return `Sends one test notification (state "test", rule "alerts-test", nothing
firing) to a sink of the config, from this machine, through the code a node
sends real notifications with: the config's egress.allow and the addresses
its hosts resolve to now, the sink's tls: files, its credentials (${VAR}
references read from this environment). No database is needed and nothing is
recorded. Exit status 1, with the reason, when the sink did not accept it; a
log sink writes its line to this command's log (stderr).

Run it where the nodes run, with their environment: what this machine may
reach is what is tested.

Examples:
  mefor alerts test mail --config mefor.yaml
  mefor alerts test siem --config mefor.yaml`
}

func (c *alertsTestCmd) Run(ctx context.Context, g *Globals) error {
	data, err := os.ReadFile(c.Config)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	cfg, err := config.Parse(c.Config, data, g.env())
	if err != nil {
		return err
	}
	sink := cfg.Alerts.Sink(c.Sink)
	if sink == nil {
		var names []string
		if cfg.Alerts != nil {
			for _, s := range cfg.Alerts.Sinks {
				names = append(names, s.Name)
			}
		}
		if len(names) == 0 {
			return fmt.Errorf("%s has no alert sinks (alerts.sinks)", c.Config)
		}
		return fmt.Errorf("%q is not an alert sink of %s; its sinks are %s", c.Sink, c.Config, strings.Join(names, ", "))
	}
	set, err := tlsconf.New(cfg, time.Now())
	if err != nil {
		return err
	}
	var policy *egress.Policy
	if cfg.Egress != nil {
		var errs []error
		policy, errs = egress.NewPolicy(ctx, cfg.Egress.Allow, cfg.OutboundHosts(), egress.Options{})
		for _, err := range errs {
			g.logger.WarnContext(ctx, "egress: a host the config connects to did not resolve", "error", err)
		}
	}
	host, _ := os.Hostname()
	sender := &notify.Sender{Logger: g.logger, Hostname: host,
		Transport: func(s *config.AlertSink) notify.Transport { return notify.TransportOf(policy, set, s.Name) }}
	payload, err := json.Marshal(notify.Test(sink.Name, time.Now().UTC()))
	if err != nil {
		return err
	}
	if err := sender.Send(ctx, sink, payload); err != nil {
		return &exitError{code: 1, err: fmt.Errorf("test notification to sink %s (%s) not accepted: %w", sink.Name, sink.Kind(), err)}
	}
	fmt.Fprintf(g.stdout, "test notification sent to sink %s (%s)\n", sink.Name, sink.Kind())
	return nil
}
