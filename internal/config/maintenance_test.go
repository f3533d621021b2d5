package config_test

import (
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
)

func TestParseSchedule(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	now := at("2026-03-10T14:20:00Z")
	tests := []struct {
		in, want, str string
	}{
		{in: "15m", want: "2026-03-10T14:35:00Z", str: "15m"},
		{in: "1h30m", want: "2026-03-10T15:50:00Z", str: "1h30m"},
		{in: "0 3 * * *", want: "2026-03-11T03:00:00Z", str: "0 3 * * *"},
		{in: "*/10 * * * *", want: "2026-03-10T14:30:00Z"},
		{in: "@daily", want: "2026-03-11T00:00:00Z"},
		{in: "@hourly", want: "2026-03-10T15:00:00Z"},
		{in: "@every 2h", want: "2026-03-10T16:20:00Z"},
		// Cron is UTC whatever zone the caller's clock is in, so every node
		// agrees; CRON_TZ picks another zone.
		{in: "CRON_TZ=America/New_York 0 3 * * *", want: "2026-03-11T07:00:00Z"},
	}
	for _, tt := range tests {
		s, err := config.ParseSchedule(tt.in)
		if err != nil {
			t.Errorf("ParseSchedule(%q): %v", tt.in, err)
			continue
		}
		if s.IsZero() {
			t.Errorf("ParseSchedule(%q) is zero", tt.in)
		}
		local := now.In(time.FixedZone("UTC+5", 5*3600))
		if got := s.Next(local); !got.Equal(at(tt.want)) {
			t.Errorf("ParseSchedule(%q).Next(%s) = %s, want %s", tt.in, now, got.UTC(), tt.want)
		}
		if want := tt.str; want != "" && s.String() != want {
			t.Errorf("ParseSchedule(%q).String() = %q, want %q", tt.in, s.String(), want)
		}
	}

	bad := []struct{ in, msg string }{
		{"", "is empty"},
		{"15", `"15" needs a unit`},
		{"0s", "must be longer than zero"},
		{"-5m", "must be longer than zero"},
		{"15mins", "is not a duration"},
		{"0 3 * *", "cron expression of 5 fields"},
		{"0 25 * * *", "cron expression of 5 fields"},
		{"@fortnightly", "cron expression of 5 fields"},
	}
	for _, tt := range bad {
		_, err := config.ParseSchedule(tt.in)
		if err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("ParseSchedule(%q) = %v, want an error containing %q", tt.in, err, tt.msg)
		}
	}

	var zero config.Schedule
	if !zero.IsZero() || zero.Next(now).Before(now.AddDate(100, 0, 0)) {
		t.Errorf("the zero Schedule should never fire; Next = %s", zero.Next(now))
	}
	if d, ok := config.Every(time.Minute).Interval(); !ok || d != time.Minute {
		t.Errorf("Every(1m).Interval() = %v, %v", d, ok)
	}
}

func TestMaintenanceDefaults(t *testing.T) {
	c, err := parse(t, minimal, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := c.Maintenance.Reclaim.Schedule.Interval(); !ok || d != 5*time.Second {
		t.Errorf("default reclaim schedule = %s, want every 5s", c.Maintenance.Reclaim.Schedule)
	}
	if d, ok := c.Maintenance.AuditAnchor.Schedule.Interval(); !ok || d != 15*time.Minute {
		t.Errorf("default audit_anchor schedule = %s, want every 15m", c.Maintenance.AuditAnchor.Schedule)
	}
	// Without a block no content is purged, but `error` messages are not
	// kept forever: keep_errors has a default.
	if r := c.Maintenance.Retention; r == nil || r.KeepBodies != 0 || r.KeepDead != 0 || r.DeleteAfter != 0 ||
		r.KeepState != 0 || r.KeepErrors != 30*24*time.Hour || r.KeepErrorsGiven {
		t.Errorf("retention without a block = %+v; want only keep_errors, at its 30d default", r)
	}

	c, err = parse(t, minimal+`
maintenance:
  retention:
    keep_bodies: 30d
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := c.Maintenance.Retention
	if r == nil {
		t.Fatal("retention not configured")
	}
	if r.KeepBodies != 30*24*time.Hour || r.KeepDead != r.KeepBodies || r.DeleteAfter != 0 || r.BatchSize != 5000 ||
		r.KeepErrors != 30*24*time.Hour {
		t.Errorf("retention = %+v; want keep_dead defaulting to keep_bodies, no deletion, batches of 5000, keep_errors 30d", r)
	}
	if d, ok := r.Schedule.Interval(); !ok || d != time.Hour {
		t.Errorf("default retention schedule = %s, want hourly", r.Schedule)
	}
}

func TestMaintenanceFull(t *testing.T) {
	c, err := parse(t, minimal+`
maintenance:
  reclaim:
    schedule: 10s
  audit_anchor:
    schedule: 5m
  retention:
    schedule: "30 2 * * *"
    keep_bodies: 36h
    keep_dead: 90d
    delete_after: 365d
    batch_size: 1000
`, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Maintenance.Reclaim.Schedule.String() != "10s" {
		t.Errorf("reclaim schedule = %s", c.Maintenance.Reclaim.Schedule)
	}
	if c.Maintenance.AuditAnchor.Schedule.String() != "5m" {
		t.Errorf("audit_anchor schedule = %s", c.Maintenance.AuditAnchor.Schedule)
	}
	r := c.Maintenance.Retention
	if r.Schedule.String() != "30 2 * * *" || r.KeepBodies != 36*time.Hour || r.KeepDead != 90*24*time.Hour ||
		r.DeleteAfter != 365*24*time.Hour || r.BatchSize != 1000 {
		t.Errorf("retention = %+v", r)
	}
}

// keep_errors never ends a dead letter's keep_dead window early: left out,
// it follows a longer keep_dead; given, it may be shorter than keep_bodies
// (junk need not outlive good messages' content), and alone in the block it
// needs no keep_bodies.
func TestKeepErrors(t *testing.T) {
	day := 24 * time.Hour
	tests := []struct {
		doc                              string
		keepErrors, keepBodies, keepDead time.Duration
	}{
		{"keep_bodies: 30d\n    keep_dead: 90d", 90 * day, 30 * day, 90 * day},
		{"keep_bodies: 400d", 400 * day, 400 * day, 400 * day},
		{"keep_bodies: 7d", 30 * day, 7 * day, 7 * day},
		// A dead letter's content goes with it at keep_errors.
		{"keep_bodies: 30d\n    keep_errors: 7d", 7 * day, 30 * day, 7 * day},
		{"keep_errors: 14d", 14 * day, 0, 0},
		{"keep_bodies: 30d\n    keep_dead: 90d\n    keep_errors: 90d", 90 * day, 30 * day, 90 * day},
	}
	for _, tt := range tests {
		c, err := parse(t, minimal+"maintenance:\n  retention:\n    "+tt.doc+"\n", nil)
		if err != nil {
			t.Errorf("%q: %v", tt.doc, err)
			continue
		}
		if r := c.Maintenance.Retention; r.KeepErrors != tt.keepErrors || r.KeepBodies != tt.keepBodies || r.KeepDead != tt.keepDead {
			t.Errorf("%q: keep_errors %s, keep_bodies %s, keep_dead %s; want %s, %s and %s", tt.doc,
				r.KeepErrors, r.KeepBodies, r.KeepDead, tt.keepErrors, tt.keepBodies, tt.keepDead)
		}
	}
}

func TestMaintenanceValidation(t *testing.T) {
	// minimal is 10 lines; the maintenance block starts on line 11.
	checkInvalid(t, minimal, []invalid{
		{
			name: "not a schedule",
			doc: `
maintenance:
  retention:
    schedule: every night
    keep_bodies: 30d
`,
			want: []wantErr{{13, "maintenance.retention.schedule", `"every night" is neither an interval (e.g. 15m) nor a cron expression`}},
		},
		{
			name: "bare number schedule",
			doc: `
maintenance:
  reclaim:
    schedule: 30
`,
			want: []wantErr{{13, "maintenance.reclaim.schedule", `"30" needs a unit`}},
		},
		{
			name: "reclaim too often",
			doc: `
maintenance:
  reclaim:
    schedule: 100ms
`,
			want: []wantErr{{13, "maintenance.reclaim.schedule", "too often"}},
		},
		{
			name: "audit_anchor too often",
			doc: `
maintenance:
  audit_anchor:
    schedule: 100ms
`,
			want: []wantErr{{13, "maintenance.audit_anchor.schedule", "too often"}},
		},
		{
			name: "keep_bodies missing",
			doc: `
maintenance:
  retention:
    schedule: 1h
`,
			want: []wantErr{{12, "maintenance.retention.keep_bodies", "is required"}},
		},
		{
			name: "bad days",
			doc: `
maintenance:
  retention:
    keep_bodies: 1.5d
    keep_dead: 30
`,
			want: []wantErr{
				{13, "maintenance.retention.keep_bodies", "is not a number of days"},
				{14, "maintenance.retention.keep_dead", "needs a unit"},
			},
		},
		{
			name: "delete before the bodies expire",
			doc: `
maintenance:
  retention:
    keep_bodies: 30d
    keep_dead: 90d
    delete_after: 60d
    batch_size: 5
`,
			want: []wantErr{
				{15, "maintenance.retention.delete_after", "(60d) is shorter than keep_dead (90d)"},
				{16, "maintenance.retention.batch_size", "must be from 10 to 100000"},
			},
		},
		{
			name: "keep_errors shorter than keep_dead",
			doc: `
maintenance:
  retention:
    keep_bodies: 30d
    keep_dead: 90d
    keep_errors: 60d
`,
			want: []wantErr{{15, "maintenance.retention.keep_errors", "(60d) is shorter than keep_dead (90d): dead letters would be deleted while they are meant to stay replayable; make it at least 90d"}},
		},
		{
			name: "keep_errors not a window",
			doc: `
maintenance:
  retention:
    keep_errors: 0d
`,
			want: []wantErr{{13, "maintenance.retention.keep_errors", "must be > 0 (e.g. keep_errors: 30d)"}},
		},
		{
			name: "keep_dead without keep_bodies",
			doc: `
maintenance:
  retention:
    keep_dead: 90d
    keep_errors: 90d
`,
			want: []wantErr{{12, "maintenance.retention.keep_bodies", "is required with keep_dead"}},
		},
		{
			name: "unknown key",
			doc: `
maintenance:
  retention:
    keep_body: 30d
`,
			want: []wantErr{
				{12, "maintenance.retention.keep_bodies", "is required"},
				{13, "maintenance.retention.keep_body", "did you mean keep_bodies"},
			},
		},
	})
}
