package hl7

import (
	"bytes"
	"errors"
	"testing"
)

func FuzzParse(f *testing.F) {
	for _, raw := range wellFormed {
		f.Add([]byte(raw))
	}
	for _, raw := range []string{
		"MSH|^~\\&|A\nPID|1\r\nPV1|1\n\n",
		"\xef\xbb\xbf\r\nMSH|^~\\&#|A|B\rPID|x\\P\\y",
		"MSH|^~|", "MSH|", "MSH", "", "PID|1", "MSH|^~\\&|A\rMSH|^~\\&|B",
		"MSH|^~\\&|A\rOBX|1|TX|||a\\X0D\\b\\Xzz\\c\\",
	} {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		m, err := Parse(raw)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Kind == nil {
				t.Fatalf("error %v is not a *ParseError with a Kind", err)
			}
			_ = err.Error()
			_ = NewACKForUnparsed(raw, AckReject, "x", "1", ackTime)
			return
		}
		enc := m.Encode()
		m2, err := Parse(enc)
		if err != nil {
			t.Fatalf("re-parse of Encode failed: %v\n%q", err, enc)
		}
		if enc2 := m2.Encode(); !bytes.Equal(enc, enc2) {
			t.Fatalf("Encode not stable\nfirst:  %q\nsecond: %q", enc, enc2)
		}
		if !bytes.Equal(m.Clone().Encode(), enc) {
			t.Fatal("Clone encodes differently")
		}
		if _, err := ParseACK(NewACK(m, AckError, "x", "1", ackTime)); err != nil {
			t.Fatalf("ACK of a parsed message does not parse: %v", err)
		}
		_ = m.Header()
		_ = m.String()
	})
}

// FuzzPath checks that any path either fails to parse or round-trips, and
// that Set→Get returns the value set, including after Encode→Parse.
func FuzzPath(f *testing.F) {
	for _, s := range []string{
		"PID-3", "PID-3[2].1", "OBX(2)-5", "PID-3.1.2", "MSH-9.2", "MSH-10", "MSH-2",
		"ZZ1(3)-4[2].1.1", "PID-0", "PID-3.1.2.3", "pid-3",
	} {
		f.Add(s, "value")
	}
	f.Add("PID-5.1", "O'Brien|^~\\&\r\n#\\X41\\")
	f.Fuzz(func(t *testing.T, path, value string) {
		p, err := ParsePath(path)
		if err != nil {
			var pe *PathError
			if !errors.As(err, &pe) {
				t.Fatalf("error %T is not a *PathError", err)
			}
			return
		}
		if q, err := ParsePath(p.String()); err != nil || q != p {
			t.Fatalf("ParsePath(%q).String() = %q does not round-trip: %v", path, p.String(), err)
		}
		for _, raw := range []string{adtA01, nonDefault, v27} {
			m := mustParse(t, raw)
			_, _ = m.LookupPath(p)
			if err := m.SetPath(p, value); err != nil {
				if !p.ReadOnly() {
					t.Fatalf("SetPath(%s): %v", p, err)
				}
				continue
			}
			if got := m.GetPath(p); got != value {
				t.Fatalf("GetPath(%s) = %q after setting %q", p, got, value)
			}
			m2, err := Parse(m.Encode())
			if err != nil {
				t.Fatalf("Encode after SetPath(%s) does not parse: %v", p, err)
			}
			if got := m2.GetPath(p); got != value {
				t.Fatalf("GetPath(%s) = %q after re-parse, set %q", p, got, value)
			}
			if err := m2.ClearPath(p); err != nil {
				t.Fatalf("ClearPath(%s): %v", p, err)
			}
			if got := m2.GetPath(p); got != "" {
				t.Fatalf("GetPath(%s) = %q after Clear", p, got)
			}
		}
	})
}

// FuzzCopy checks that Copy between any two paths leaves a message that
// encodes stably, and that the target then reads as the source did.
func FuzzCopy(f *testing.F) {
	f.Add("PID-5", "NK1-2.1.1")
	f.Add("PID-3", "PID-3[2]")
	f.Add("MSH-2", "ZZZ(2)-1")
	f.Add("PID-3[3].4", "PID-3.4.2")
	f.Fuzz(func(t *testing.T, from, to string) {
		pf, err1 := ParsePath(from)
		pt, err2 := ParsePath(to)
		if err1 != nil || err2 != nil {
			return
		}
		for _, raw := range []string{adtA01, nonDefault, v27} {
			m := mustParse(t, raw)
			want := m.GetPath(pf)
			rawFrom, _ := m.raw(pf)
			if err := m.Copy(pf, pt); err != nil {
				if !pt.ReadOnly() {
					t.Fatalf("Copy(%s, %s): %v", pf, pt, err)
				}
				continue
			}
			enc := m.Encode()
			m2, err := Parse(enc)
			if err != nil {
				t.Fatalf("Copy(%s, %s) left an unparsable message: %v", pf, pt, err)
			}
			if enc2 := m2.Encode(); !bytes.Equal(enc, enc2) {
				t.Fatalf("Copy(%s, %s): Encode not stable", pf, pt)
			}
			// Flattening escapes separators, which only reads back the same
			// if the source has no escape sequences the separators could
			// fall inside of.
			if bytes.IndexByte([]byte(rawFrom), m.delims.Escape) < 0 || pf.delimiterField() {
				if got := m2.GetPath(pt); got != want {
					t.Fatalf("Copy(%s, %s): target reads %q, source read %q", pf, pt, got, want)
				}
			}
		}
	})
}

// FuzzSplitFile checks the batch-file splitter: it never panics; a refusal
// is a *BatchError; what it accepts is one message per MSH line, each an
// MSH and its segments joined with \r, and splitting those again gives
// them back unchanged.
func FuzzSplitFile(f *testing.F) {
	a := "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ORU^R01|1|P|2.5\rPID|1||X\rOBX|1|NM|GLU||5.5\r"
	b := "MSH|^~\\&|LAB|H|MEFOR|H|20240101||ORU^R01|2|P|2.5\nPID|1||Y\n"
	for _, raw := range []string{
		a + b, a, "\r\n\r\n" + a + "\r\n",
		"FHS|^~\\&|LAB\rBHS|^~\\&|LAB\r" + a + "BTS|1\rFTS|1\r",
		"FHS|^~\\&\rBHS|^~\\&\r" + a + "BTS|2\rBHS\r" + b + "BTS|1\rFTS|2|done\r",
		"BHS|^~\\&\r" + a + "BTS\r", "BHS|^~\\&\r" + a, "hello\r" + a, "FTS|1\r", "", "MSH", "BTS|-1\r",
	} {
		f.Add([]byte(raw))
	}
	for _, raw := range wellFormed {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		msgs, err := SplitFile(data)
		if err != nil {
			var be *BatchError
			if !errors.As(err, &be) || !errors.Is(err, ErrBatch) {
				t.Fatalf("error %v is not a *BatchError", err)
			}
			if msgs != nil {
				t.Fatal("messages returned with an error")
			}
			return
		}
		if len(msgs) == 0 {
			t.Fatal("no messages and no error")
		}
		mshLines := 0
		for _, line := range bytes.FieldsFunc(data, func(r rune) bool { return r == '\r' || r == '\n' }) {
			if len(bytes.TrimSpace(line)) > 0 && segmentID(line) == "MSH" {
				mshLines++
			}
		}
		if mshLines != len(msgs) {
			t.Fatalf("%d MSH lines gave %d messages", mshLines, len(msgs))
		}
		for i, m := range msgs {
			if !bytes.HasPrefix(m, []byte("MSH")) || m[len(m)-1] != '\r' || bytes.IndexByte(m, '\n') >= 0 {
				t.Fatalf("message %d is not MSH and segments ending in \\r: %q", i, m)
			}
			again, err := SplitFile(m)
			if err != nil || len(again) != 1 || !bytes.Equal(again[0], m) {
				t.Fatalf("message %d split again gives %q, %v", i, again, err)
			}
		}
	})
}

// FuzzParseACK checks the parser of partners' acknowledgments: it never
// panics, a refusal is a *ParseError with a Kind (so no partner's reply
// is taken for an accept by accident), and an accepted reply has one of
// the six codes and the MSA's control id.
func FuzzParseACK(f *testing.F) {
	orig, err := Parse([]byte(adtA01))
	if err != nil {
		f.Fatal(err)
	}
	for _, code := range []AckCode{AckAccept, AckError, AckReject, AckCommitAccept, AckCommitError, AckCommitReject} {
		f.Add(NewACK(orig, code, "text", "CTRL1", ackTime))
	}
	for _, raw := range []string{
		"MSH|^~\\&|A|B|C|D|20240101||ACK|1|P|2.5\rMSA|AA|X\r",
		"MSH|^~\\&|A|B|C|D|20240101||ACK|1|P|2.5\rMSA|ZZ|X\r",
		"MSH|^~\\&|A|B|C|D|20240101||ACK|1|P|2.5\rMSA\r",
		"MSH|^~\\&|A|B|C|D|20240101||ACK|1|P|2.5\r",
		"MSH|^~\\&|A\rMSA|AE|X|\rERR|||207^x^HL70357|E||||see ERR-8\r",
		"MSH#*@!%#A\rMSA#CA#X\r", "MSA|AA|X\r", "", "MSH|",
	} {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ack, err := ParseACK(raw)
		if err != nil {
			var pe *ParseError
			if !errors.As(err, &pe) || pe.Kind == nil {
				t.Fatalf("error %v is not a *ParseError with a Kind", err)
			}
			if ack != (Ack{}) {
				t.Fatalf("ack %+v returned with an error", ack)
			}
			return
		}
		if !ack.Code.Valid() {
			t.Fatalf("accepted code %q", ack.Code)
		}
		m, err := Parse(raw)
		if err != nil {
			t.Fatalf("ParseACK accepted what Parse refuses: %v", err)
		}
		if ack.Code != AckCode(m.Get("MSA-1")) || ack.ControlID != m.Get("MSA-2") {
			t.Fatalf("ack %+v does not match MSA-1 %q, MSA-2 %q", ack, m.Get("MSA-1"), m.Get("MSA-2"))
		}
	})
}
