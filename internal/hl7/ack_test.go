package hl7

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var ackTime = time.Date(2024, 3, 5, 14, 7, 9, 0, time.UTC)

func TestNewACK(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		orig string
		code AckCode
		text string
		want string
	}{
		{
			name: "accept",
			orig: adtA01,
			code: AckAccept,
			want: seg(
				`MSH|^~\&|GHH LAB, INC.|GOOD HEALTH HOSPITAL|ADT1|GOOD HEALTH HOSPITAL|20240305140709||ACK^A01^ACK|ACK1|P|2.5.1`,
				`MSA|AA|MSG00001`,
			),
		},
		{
			name: "error, v2.5+ ERR",
			orig: adtA01,
			code: AckError,
			text: "could not store: queue|full",
			want: seg(
				`MSH|^~\&|GHH LAB, INC.|GOOD HEALTH HOSPITAL|ADT1|GOOD HEALTH HOSPITAL|20240305140709||ACK^A01^ACK|ACK1|P|2.5.1`,
				`MSA|AE|MSG00001|could not store: queue\F\full`,
				`ERR|||207^Application internal error^HL70357|E||||could not store: queue\F\full`,
			),
		},
		{
			name: "reject, v2.4 ERR",
			orig: oruR01,
			code: AckReject,
			text: "no route",
			want: seg(
				`MSH|^~\&|GHH OE|BLDG4|GHH LAB|ELAB-3|20240305140709||ACK^R01^ACK|ACK1|P|2.4`,
				`MSA|AR|CNTRL-3456|no route`,
				`ERR|^^^207&Application internal error&HL70357`,
			),
		},
		{
			name: "non-default delimiters, composite fields copied whole",
			orig: nonDefault,
			code: AckCommitAccept,
			want: seg(
				`MSH#*@!%#RECV#RFAC#SENDER*1.2.3*ISO#FAC#20240305140709##ACK*A08*ACK#ACK1#T#2.3`,
				`MSA#CA#CTRL-77`,
			),
		},
		{
			name: "v2.7 keeps the truncation character",
			orig: v27,
			code: AckCommitError,
			text: "busy",
			want: seg(
				`MSH|^~\&#|RAPP|RFAC|APP|FAC|20240305140709||ACK^A04^ACK|ACK1|P|2.7`,
				`MSA|CE|C1|busy`,
				`ERR|||207^Application internal error^HL70357|E||||busy`,
			),
		},
		{
			name: "sparse MSH",
			orig: seg(`MSH|^~\&`),
			code: AckAccept,
			want: seg(`MSH|^~\&|||||20240305140709||ACK|ACK1||`, `MSA|AA|`),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := string(NewACK(mustParse(t, tt.orig), tt.code, tt.text, "ACK1", ackTime))
			if got != tt.want {
				t.Errorf("NewACK\n got: %q\nwant: %q", got, tt.want)
			}
		})
	}
}

func TestACKRoundTrip(t *testing.T) {
	t.Parallel()
	for name, raw := range map[string]string{"adt": adtA01, "oru": oruR01, "non-default": nonDefault, "v2.7": v27} {
		for _, code := range []AckCode{AckAccept, AckError, AckReject, AckCommitAccept, AckCommitError, AckCommitReject} {
			orig := mustParse(t, raw)
			text := ""
			if !code.IsAccept() {
				text = "failed ^ with | delimiters & such"
			}
			ackRaw := NewACK(orig, code, text, "CTRL^1", ackTime)

			ack, err := ParseACK(ackRaw)
			if err != nil {
				t.Fatalf("%s %s: ParseACK: %v", name, code, err)
			}
			want := Ack{Code: code, ControlID: orig.ControlID(), Text: text}
			if ack != want {
				t.Errorf("%s %s: ParseACK = %+v, want %+v", name, code, ack, want)
			}

			m := mustParse(t, string(ackRaw))
			o, a := orig.Header(), m.Header()
			if a.SendingApplication != o.ReceivingApplication || a.SendingFacility != o.ReceivingFacility ||
				a.ReceivingApplication != o.SendingApplication || a.ReceivingFacility != o.SendingFacility {
				t.Errorf("%s %s: applications not swapped: orig %+v, ack %+v", name, code, o, a)
			}
			if a.Version != o.Version || a.ProcessingID != o.ProcessingID {
				t.Errorf("%s %s: version/processing id %q/%q, want %q/%q", name, code, a.Version, a.ProcessingID, o.Version, o.ProcessingID)
			}
			if a.MessageType != "ACK" || a.TriggerEvent != o.TriggerEvent || a.ControlID != "CTRL^1" {
				t.Errorf("%s %s: MSH-9/10 = %s^%s %q", name, code, a.MessageType, a.TriggerEvent, a.ControlID)
			}
			if m.Delimiters() != orig.Delimiters() {
				t.Errorf("%s %s: delimiters %+v, want %+v", name, code, m.Delimiters(), orig.Delimiters())
			}
			if got := m.Get("MSH-7"); got != "20240305140709" {
				t.Errorf("%s %s: MSH-7 = %q", name, code, got)
			}
		}
	}
}

func TestNewACKForUnparsed(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		raw  string
		want string
	}{
		{
			name: "broken later segment: MSH still used",
			raw:  "MSH|^~\\&|APP|FAC|RAPP|RFAC|2024||ORM^O01|C9|P|2.3.1\rPID|ok\rnot a segment\r",
			want: seg(`MSH|^~\&|RAPP|RFAC|APP|FAC|20240305140709||ACK^O01^ACK|ACK1|P|2.3.1`, `MSA|AR|C9|bad`, `ERR|^^^207&Application internal error&HL70357`),
		},
		{
			name: "LF terminated, leading BOM",
			raw:  "\xef\xbb\xbfMSH#*@!%#APP#FAC#RAPP#RFAC#2024##ORM*O01#C9#P#2.5\nPID#x\n\x00",
			want: seg(`MSH#*@!%#RAPP#RFAC#APP#FAC#20240305140709##ACK*O01*ACK#ACK1#P#2.5`, `MSA#AR#C9#bad`, `ERR###207*Application internal error*HL70357#E####bad`),
		},
		{
			name: "bad delimiters: defaults, nothing copied",
			raw:  "MSH|^^\\&|APP|FAC|RAPP|RFAC|2024||ORM^O01|C9|P|2.5\r",
			want: seg(`MSH|^~\&|||||20240305140709||ACK|ACK1||`, `MSA|AR||bad`, `ERR|||207^Application internal error^HL70357|E||||bad`),
		},
		{
			name: "not HL7 at all",
			raw:  "GET / HTTP/1.1\r\n",
			want: seg(`MSH|^~\&|||||20240305140709||ACK|ACK1||`, `MSA|AR||bad`, `ERR|||207^Application internal error^HL70357|E||||bad`),
		},
		{
			name: "empty",
			raw:  "",
			want: seg(`MSH|^~\&|||||20240305140709||ACK|ACK1||`, `MSA|AR||bad`, `ERR|||207^Application internal error^HL70357|E||||bad`),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := string(NewACKForUnparsed([]byte(tt.raw), AckReject, "bad", "ACK1", ackTime))
			if got != tt.want {
				t.Errorf("NewACKForUnparsed\n got: %q\nwant: %q", got, tt.want)
			}
			if _, err := ParseACK([]byte(got)); err != nil {
				t.Errorf("ParseACK of the result: %v", err)
			}
		})
	}
	if got, want := string(NewACK(nil, AckError, "", "X", ackTime)), seg(`MSH|^~\&|||||20240305140709||ACK|X||`, `MSA|AE|`, `ERR|||207^Application internal error^HL70357|E`); got != want {
		t.Errorf("NewACK(nil)\n got: %q\nwant: %q", got, want)
	}
}

func TestParseACK(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		raw  string
		want Ack
		kind error
	}{
		{"accept", seg(`MSH|^~\&|A|B|C|D|2024||ACK^A01^ACK|9|P|2.5`, `MSA|AA|MSG1`), Ack{Code: AckAccept, ControlID: "MSG1"}, nil},
		{"text in MSA-3", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.3`, `MSA|AE|MSG1|Unknown \T\ bad`), Ack{Code: AckError, ControlID: "MSG1", Text: "Unknown & bad"}, nil},
		{"text in ERR-8", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.5`, `MSA|AR|MSG1`, `ERR|||207^Internal^HL70357|E||||Try later`), Ack{Code: AckReject, ControlID: "MSG1", Text: "Try later"}, nil},
		{"text in ERR-3.2", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.5`, `MSA|CR|MSG1`, `ERR|||200^Unsupported message type^HL70357|E`), Ack{Code: AckCommitReject, ControlID: "MSG1", Text: "Unsupported message type"}, nil},
		{"text in ERR-1", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.4`, `MSA|CE|MSG1`, `ERR|PID^1^3^101&Required field missing&HL70357`), Ack{Code: AckCommitError, ControlID: "MSG1", Text: "Required field missing"}, nil},
		{"application ack of another type", seg(`MSH|^~\&|A|B|C|D|2024||ORL^O22|9|P|2.5`, `MSA|AA|MSG1`, `PID|1`), Ack{Code: AckAccept, ControlID: "MSG1"}, nil},
		{"no MSA", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.5`), Ack{}, ErrNoMSA},
		{"unknown code", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.5`, `MSA|OK|MSG1`), Ack{}, ErrBadAckCode},
		{"lowercase code", seg(`MSH|^~\&|A|B|C|D|2024||ACK|9|P|2.5`, `MSA|aa|MSG1`), Ack{}, ErrBadAckCode},
		{"garbage", "hello", Ack{}, ErrNoMSH},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseACK([]byte(tt.raw))
			if !errors.Is(err, tt.kind) || (tt.kind == nil) != (err == nil) {
				t.Fatalf("ParseACK error = %v, want %v", err, tt.kind)
			}
			if err != nil {
				var pe *ParseError
				if !errors.As(err, &pe) {
					t.Errorf("error %T is not a *ParseError", err)
				}
				if strings.Contains(err.Error(), "OK") {
					t.Errorf("error quotes content: %v", err)
				}
			}
			if got != tt.want {
				t.Errorf("ParseACK = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestAckCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code                           AckCode
		valid, accept, isError, reject bool
	}{
		{AckAccept, true, true, false, false},
		{AckCommitAccept, true, true, false, false},
		{AckError, true, false, true, false},
		{AckCommitError, true, false, true, false},
		{AckReject, true, false, false, true},
		{AckCommitReject, true, false, false, true},
		{"XX", false, false, false, false},
		{"", false, false, false, false},
	}
	for _, tt := range tests {
		if tt.code.Valid() != tt.valid || tt.code.IsAccept() != tt.accept || tt.code.IsError() != tt.isError || tt.code.IsReject() != tt.reject {
			t.Errorf("%q: Valid/IsAccept/IsError/IsReject = %v/%v/%v/%v", tt.code, tt.code.Valid(), tt.code.IsAccept(), tt.code.IsError(), tt.code.IsReject())
		}
	}
}

func TestNewControlID(t *testing.T) {
	t.Parallel()
	seen := make(map[string]bool)
	for range 10000 {
		id := NewControlID()
		if len(id) != 20 {
			t.Fatalf("NewControlID() = %q, %d chars", id, len(id))
		}
		for i := range len(id) {
			if c := id[i]; !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
				t.Fatalf("NewControlID() = %q has %q", id, c)
			}
		}
		if seen[id] {
			t.Fatalf("NewControlID() repeated %q", id)
		}
		seen[id] = true
	}
	if got := newControlID(time.Unix(0, 0))[:12]; got != "000000000000" {
		t.Errorf("epoch prefix = %q", got)
	}
}
