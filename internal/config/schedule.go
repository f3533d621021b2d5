package config

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"
)

// Schedule says when a periodic job runs: either every fixed interval or at
// the times a cron expression names. It has a Next method, so it can be used
// directly as a river.PeriodicSchedule without this package depending on
// River.
//
// Cron expressions are evaluated in UTC, so every node of a cluster agrees on
// when "0 3 * * *" is, whatever its local time zone. Prefix the expression
// with CRON_TZ=Area/City to use another zone.
//
// The zero Schedule never fires; IsZero tells it apart.
type Schedule struct {
	every time.Duration
	cron  cron.Schedule
	spec  string // as written, for String
}

// Every returns a Schedule firing every d. d must be positive.
func Every(d time.Duration) Schedule {
	return Schedule{every: d, spec: d.String()}
}

// ParseSchedule reads a schedule as written in a configuration file: a
// duration with a unit (15m, 1h30m) or a cron expression of five fields
// ("0 3 * * *") or a descriptor (@daily, @hourly, @every 2h).
func ParseSchedule(s string) (Schedule, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Schedule{}, fmt.Errorf("is empty; write an interval such as 15m or a cron expression such as \"0 3 * * *\"")
	}
	if _, err := strconv.ParseFloat(s, 64); err == nil {
		return Schedule{}, fmt.Errorf("%q needs a unit: write %sm for minutes or %sh for hours, or a cron expression such as \"0 3 * * *\"", s, s, s)
	}
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return Schedule{}, fmt.Errorf("%q must be longer than zero (e.g. 15m)", s)
		}
		return Schedule{every: d, spec: s}, nil
	}
	if looksLikeDuration(s) {
		return Schedule{}, fmt.Errorf("%q is not a duration; use a number with a unit such as 30s, 15m or 6h", s)
	}
	sched, err := cron.ParseStandard(s)
	if err != nil {
		return Schedule{}, fmt.Errorf("%q is neither an interval (e.g. 15m) nor a cron expression of 5 fields: minute hour day-of-month month day-of-week (e.g. \"0 3 * * *\" for 03:00 UTC daily, or @daily): %v", s, err)
	}
	return Schedule{cron: sched, spec: s}, nil
}

// looksLikeDuration reports whether s is a single word starting with a
// digit, such as "15 m" mistyped as "15mins": cron expressions have spaces
// or start with @, so such a word is a bad duration, and saying so helps more
// than a cron parser's complaint.
func looksLikeDuration(s string) bool {
	return !strings.ContainsAny(s, " \t") && s[0] >= '0' && s[0] <= '9'
}

// Next returns the first time after t at which the schedule fires. The zero
// Schedule returns a time so far ahead that it never comes.
func (s Schedule) Next(t time.Time) time.Time {
	switch {
	case s.every > 0:
		return t.Add(s.every)
	case s.cron != nil:
		return s.cron.Next(t.UTC())
	}
	return t.AddDate(1000, 0, 0)
}

// Interval returns the fixed interval of an interval schedule, and false for
// a cron schedule or the zero Schedule.
func (s Schedule) Interval() (time.Duration, bool) {
	return s.every, s.every > 0
}

// IsZero reports whether s is the zero Schedule, which never fires.
func (s Schedule) IsZero() bool {
	return s.every == 0 && s.cron == nil
}

// String returns the schedule as it was written in the file, Go's spelling
// of the interval for Every ("15m0s"), and "" for the zero Schedule.
func (s Schedule) String() string {
	return s.spec
}

// schedule sets *dst to the schedule at key k of m, if given, reporting a
// value that is neither an interval nor a cron expression at its line.
// Sections with a schedule field call it like decodeScalar.
func (l *loader) schedule(m map[string]*yaml.Node, p path, k string, dst *Schedule) {
	decodeScalar(l, m, p, k, dst, ParseSchedule)
}
