package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/jobs"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/workers"
)

// sinksYAML is alertsYAML with the sinks given (the rules' sink is ops).
func sinksYAML(sinks string) string {
	return strings.Replace(alertsYAML, `    ops:
      webhook: {url: "https://hooks.example.org/mefor"}
`, sinks, 1)
}

// `mefor alerts test SINK` sends a test notification through the sink as a
// node would, with the config's egress list; a sink that does not accept
// it, or is not in the config, is an error.
func TestAlertsTestCLI(t *testing.T) {
	t.Parallel()
	rs := testcontainers.StartRsyslog(t, testcontainers.RsyslogOptions{})
	dir := t.TempDir()
	path := filepath.Join(dir, "mefor.yaml")
	writeFile(t, path, "egress: {allow: [127.0.0.1]}\n"+sinksYAML(fmt.Sprintf(`    ops:
      syslog: {address: %q}
    down:
      syslog: {address: %q}
`, rs.Addr, unusedAddr(t))))

	var out, errb bytes.Buffer
	if code := run([]string{"alerts", "test", "ops", "--config", path}, &out, &errb); code != 0 ||
		out.String() != "test notification sent to sink ops (syslog)\n" {
		t.Fatalf("alerts test ops: exit %d\n%s%s", code, out.String(), errb.String())
	}
	lines := rs.WaitLines(t, 1)
	if len(lines) != 1 || !strings.Contains(lines[0], ` mefor - alert [mefor@32473 rule="alerts-test" state="test"] test notification to sink ops from mefor alerts test`) {
		t.Fatalf("rsyslog got %q, want the test notification", lines)
	}

	out.Reset()
	errb.Reset()
	if code := run([]string{"alerts", "test", "down", "--config", path}, &out, &errb); code != 1 ||
		!strings.Contains(errb.String(), "test notification to sink down (syslog) not accepted: syslog receiver 127.0.0.1:") ||
		!strings.Contains(errb.String(), "connect") {
		t.Fatalf("alerts test down: exit %d\n%s%s", code, out.String(), errb.String())
	}
	errb.Reset()
	if code := run([]string{"alerts", "test", "opz", "--config", path}, &out, &errb); code == 0 ||
		!strings.Contains(errb.String(), `"opz" is not an alert sink of `+path+`; its sinks are ops, down`) {
		t.Fatalf("alerts test opz: exit %d\n%s", code, errb.String())
	}
}

// A notification never holds message content: a rule over messages that
// carry a patient id, fired and sent by the notification worker to a mail,
// a syslog and a log sink, reaches each with the rule and the destination
// and nothing of the messages.
func TestAlertNotificationsHoldNoMessageContent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := newOpsFixture(t) // lab has a dead letter; every message names SECRET-PATIENT, control ids CTRLn
	smtp := testcontainers.StartSMTP(t, testcontainers.SMTPOptions{})
	rs := testcontainers.StartRsyslog(t, testcontainers.RsyslogOptions{})
	cfg, err := config.Parse("mefor.yaml", []byte(strings.Replace(sinksYAML(fmt.Sprintf(`    ops:
      email: {address: %q, from: mefor@example.org, to: [oncall@example.org], starttls: false}
    siem:
      syslog: {address: %q}
    journal:
      log: {}
`, smtp.Addr, rs.Addr)), "sinks: [ops]\n    - name: adt-quiet", "sinks: [ops, siem, journal]\n    - name: adt-quiet", 1)), nil)
	if err != nil {
		t.Fatal(err)
	}
	changes, err := workers.EvaluateAlerts(ctx, &workers.Deps{Pool: f.db.Pool}, cfg.Alerts, f.q)
	if err != nil || len(changes) != 1 || changes[0].Rule != "lab-dead" {
		t.Fatalf("evaluation: %+v, %v; want lab-dead firing", changes, err)
	}

	var logs bytes.Buffer
	w := &workers.AlertNotifyWorker{Pool: f.db.Pool, Config: func() *config.Config { return cfg },
		Logger: slog.New(slog.NewTextHandler(&logs, nil)), Hostname: "node-a"}
	rows, err := f.db.Pool.Query(ctx, `SELECT id, args FROM river_job WHERE kind = $1 ORDER BY id`, jobs.AlertNotifyArgs{}.Kind())
	if err != nil {
		t.Fatal(err)
	}
	type queued struct {
		id   int64
		args jobs.AlertNotifyArgs
	}
	list, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (queued, error) {
		var q queued
		return q, r.Scan(&q.id, &q.args)
	})
	if err != nil || len(list) != 3 {
		t.Fatalf("queued notifications: %d, %v; want one per sink", len(list), err)
	}
	for _, q := range list {
		job := &river.Job[jobs.AlertNotifyArgs]{JobRow: &rivertype.JobRow{ID: q.id, Kind: q.args.Kind(), Attempt: 1, MaxAttempts: 25}, Args: q.args}
		if err := w.Work(ctx, job); err != nil {
			t.Fatalf("notify %s: %v", q.args.Sink, err)
		}
	}

	mails := smtp.Mails(t)
	lines := rs.WaitLines(t, 1)
	if len(mails) != 1 || !strings.Contains(mails[0].Data, "Subject: [mefor] firing: lab-dead (destination lab)") {
		t.Fatalf("mails = %+v, want the firing of lab-dead", mails)
	}
	if len(lines) != 1 || !strings.Contains(lines[0], `rule="lab-dead" state="firing" destination="lab"`) {
		t.Fatalf("syslog lines = %q, want the firing of lab-dead", lines)
	}
	if !strings.Contains(logs.String(), `msg="alert firing" rule=lab-dead sink=journal`) {
		t.Fatalf("log = %s, want the firing of lab-dead", logs.String())
	}
	for what, got := range map[string]string{"mail": mails[0].Data, "syslog": lines[0], "log": logs.String()} {
		for _, phi := range []string{"SECRET-PATIENT", "CTRL", "MSH", "PID|", "ADT^A01"} {
			if strings.Contains(got, phi) {
				t.Errorf("the %s notification holds %q, message content:\n%s", what, phi, got)
			}
		}
	}
}
