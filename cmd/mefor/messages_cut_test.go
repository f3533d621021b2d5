package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/ops"
)

// A body cut at keep_unparseable says so where an operator looks: the
// listing's size column, and show's size line and body.
func TestPrintCutMessage(t *testing.T) {
	cut := search.MessageSummary{ID: 7, Channel: "adt", Status: "error", Size: 102400, CutAt: 65536}
	whole := search.MessageSummary{ID: 8, Channel: "adt", Status: "error", Size: 12}
	var b bytes.Buffer
	if err := printList(&b, false, []ops.MessageSummary{cut, whole}, summaries); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	if !strings.Contains(lines[1], "102400 (cut at 65536)") || strings.Contains(lines[2], "cut") {
		t.Fatalf("messages list:\n%s\nwant the first cut at 65536, the second not", b.String())
	}

	b.Reset()
	v := &ops.MessageView{Message: search.MessageDetail{MessageSummary: cut, Raw: []byte("JUNK")}}
	if err := printMessage(&b, v, true); err != nil {
		t.Fatal(err)
	}
	if out := b.String(); !strings.Contains(out, "102400 bytes, cut at 65536 of 102400 bytes") ||
		!strings.Contains(out, "(cut at 65536 of 102400 bytes") {
		t.Fatalf("messages show --body:\n%s\nwant the size line and the body to say it was cut at 65536 of 102400 bytes", out)
	}
}
