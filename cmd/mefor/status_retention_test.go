package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/retention"
)

// status names the retention windows by their keys, says which keep_errors
// is the default, and flags nodes that disagree.
func TestPrintRetention(t *testing.T) {
	day := int64(24 * time.Hour / time.Second)
	one := &retention.Status{Policies: []nodeinfo.RetentionInUse{{
		Retention: nodeinfo.Retention{KeepErrorsSeconds: 30 * day, KeepErrorsDefault: true}, Nodes: []string{"a", "b"}}}}
	var b bytes.Buffer
	printRetention(&b, one)
	if got, want := b.String(), "retention: keep_bodies forever, keep_dead forever, keep_errors 30d (default), delete_after never\n"; got != want {
		t.Fatalf("status:\n%q\nwant\n%q", got, want)
	}

	two := &retention.Status{Policies: []nodeinfo.RetentionInUse{
		{Retention: nodeinfo.Retention{KeepBodiesSeconds: 30 * day, KeepDeadSeconds: 90 * day, KeepErrorsSeconds: 90 * day, DeleteAfterSeconds: 365 * day}, Nodes: []string{"a"}},
		{Retention: nodeinfo.Retention{KeepErrorsSeconds: 36 * 3600, KeepErrorsDefault: false}, Nodes: []string{"b"}},
	}}
	b.Reset()
	printRetention(&b, two)
	out := b.String()
	if !strings.Contains(out, "warning: retention differs between nodes") ||
		!strings.Contains(out, "a: keep_bodies 30d, keep_dead 90d, keep_errors 90d, delete_after 365d") ||
		!strings.Contains(out, "b: keep_bodies forever, keep_dead forever, keep_errors 36h0m0s, delete_after never") {
		t.Fatalf("status with two policies:\n%s", out)
	}
}
