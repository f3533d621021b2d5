package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/ops"
)

type alertsCmd struct {
	List alertsListCmd `cmd:"" help:"List the alert rules: state, since when, value against threshold, last notification."`
}

func (c *alertsCmd) Help() string {
	return `mefor's own alerts, for teams without Prometheus. The config's alerts:
section holds sinks (a webhook, or the node's log) and rules over a
destination's or a channel's queue:

  alerts:
    interval: 30s                 # how often River's leader evaluates the rules
    sinks:
      ops:
        webhook: {url: "https://hooks.example.org/mefor", headers: {Authorization: "${HOOK_TOKEN}"}}
      journal:
        log: {level: warn}
    rules:
      - name: downstream-backlog
        destination: downstream     # or channel: NAME
        oldest_queued: 10m          # and/or queue_depth: 500, dead_letters: 1, no_traffic: 30m
        sinks: [ops, journal]

A rule fires when any of its conditions holds and resolves when none does;
each change is notified once for the whole cluster. Webhooks get a JSON POST
({"rule", "state": "firing"|"resolved", "condition", "value", "threshold",
...}); a failed POST is retried with backoff for about an hour and a half.

Examples:
  mefor alerts list
  mefor alerts list --json | jq '.[] | select(.state == "firing")'`
}

type alertsListCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

func (c *alertsListCmd) Help() string {
	return `Lists each alert rule the cluster evaluated: its state (ok or firing), since
when, the condition shown with its value and threshold as of the last
evaluation, and the last notification (what was sent to which sink, when, or
why it failed). A rule appears after its first evaluation, within one
alerts.interval of a node running a config that has it.

Examples:
  mefor alerts list
  mefor alerts list --json`
}

func (c *alertsListCmd) Run(ctx context.Context, g *Globals) error {
	return queryList(ctx, g, c.JSON, ops.ListAlerts, listing[ops.Alert]{
		Empty:  "no alert rules evaluated yet (a node runs them when its config has alerts:)",
		Header: "RULE\tSTATE\tSINCE\tCONDITION\tVALUE\tTHRESHOLD\tLAST NOTIFICATION",
		Row: func(w io.Writer, a ops.Alert) {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.Rule, a.State, fmtTime(a.Since), orDash(a.Condition),
				alertValue(a.Condition, a.Value), alertValue(a.Condition, a.Threshold), lastNotification(a))
		},
	})
}

// alertValue shows an age as a duration and a count as a number.
func alertValue(condition string, v *float64) string {
	if v == nil {
		return "-"
	}
	switch condition {
	case config.ConditionOldestQueued, config.ConditionNoTraffic:
		return (time.Duration(*v * float64(time.Second))).Round(time.Second).String()
	}
	return fmt.Sprintf("%.0f", *v)
}

func lastNotification(a ops.Alert) string {
	if a.LastNotification == "" {
		return "none"
	}
	s := a.LastNotification + " to " + a.LastSink
	if a.LastNotifyError != "" {
		return s + " failed: " + oneLine(strings.TrimPrefix(a.LastNotifyError, "alert "+a.Rule+" "+a.LastNotification+" to sink "+a.LastSink+", "))
	}
	if a.LastNotifiedAt != nil {
		s += " at " + fmtTime(*a.LastNotifiedAt)
	}
	return s
}
