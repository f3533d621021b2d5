package hl7

import (
	"errors"
	"strings"
	"testing"
)

func TestSplitFile(t *testing.T) {
	a := "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ORU^R01|1|P|2.5\rPID|1||X\rOBX|1|NM|GLU||5.5\r"
	b := "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ORU^R01|2|P|2.5\rPID|1||Y\r"
	c := "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ORU^R01|3|P|2.5\rPID|1||Z\r"
	lf := func(s string) string { return strings.ReplaceAll(s, "\r", "\n") }
	crlf := func(s string) string { return strings.ReplaceAll(s, "\r", "\r\n") }
	ok := map[string]string{
		"wire style":       a + b + c,
		"one per line":     lf(a + b + c),
		"crlf, blank":      crlf(a) + "\r\n\r\n" + crlf(b) + crlf(c) + "\r\n",
		"batch envelope":   "FHS|^~\\&|LAB\rBHS|^~\\&|LAB\r" + a + b + c + "BTS|3\rFTS|1\r",
		"two batches, lf":  lf("FHS|^~\\&|LAB\rBHS|^~\\&|LAB\r" + a + b + "BTS|2\rBHS|^~\\&|LAB\r" + c + "BTS|1\rFTS|2|done\r"),
		"counts not given": "BHS|^~\\&|LAB\r" + a + b + c + "BTS\r",
	}
	for name, in := range ok {
		t.Run(name, func(t *testing.T) {
			got, err := SplitFile([]byte(in))
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 3 || string(got[0]) != a || string(got[1]) != b || string(got[2]) != c {
				t.Fatalf("got %q", got)
			}
		})
	}

	bad := map[string]struct{ in, detail string }{
		"cut short in a batch": {"BHS|^~\\&|LAB\r" + a + b, "without its trailer"},
		"count mismatch":       {"BHS|^~\\&|LAB\r" + a + b + "BTS|3\r", "counts 3 messages, the batch holds 2"},
		"batch count":          {"FHS|^~\\&\rBHS|^~\\&\r" + a + "BTS|1\rFTS|2\r", "counts 2 batches, the file holds 1"},
		"no FTS":               {"FHS|^~\\&\r" + a, "file header (FHS) without its trailer"},
		"junk first":           {"hello\r" + a, "segment outside any message"},
		"nothing":              {"\n\n \n", "no message"},
		"only envelope":        {"FHS|^~\\&\rFTS|0\r", "no message"},
		"after FTS":            {"FHS|^~\\&\r" + a + "FTS|0\r" + b, "content after the file trailer"},
	}
	for name, tt := range bad {
		t.Run(name, func(t *testing.T) {
			got, err := SplitFile([]byte(tt.in))
			var be *BatchError
			if !errors.As(err, &be) || !errors.Is(err, ErrBatch) || !strings.Contains(err.Error(), tt.detail) {
				t.Fatalf("got %q, %v; want a BatchError saying %q", got, err, tt.detail)
			}
			if strings.Contains(err.Error(), "PID") || strings.Contains(err.Error(), "hello") {
				t.Fatalf("error quotes content: %v", err)
			}
		})
	}
}
