package console

import (
	"fmt"
	"html/template"
	"net/url"
	"time"
)

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	// iso is a time as RFC 3339 in UTC, for <time datetime> (console.js
	// shows it in the browser's zone).
	"iso": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	// utc is a time as the page shows it without JavaScript.
	"utc": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	// age is a number of seconds as 4m 10s; a dash for none.
	"age": func(s *float64) string {
		if s == nil {
			return "–"
		}
		return ageText(*s)
	},
	"seconds": ageText,
	"count":   func(m map[string]int64, key string) int64 { return m[key] },
}

func ageText(s float64) string {
	d := time.Duration(s * float64(time.Second)).Round(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm %ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh %dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd %dh", int(d.Hours())/24, int(d.Hours())%24)
}

// urlEscape escapes a query parameter's value.
func urlEscape(s string) string { return url.QueryEscape(s) }
