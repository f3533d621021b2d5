package hl7

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
)

func TestHeader(t *testing.T) {
	t.Parallel()
	tests := []struct {
		raw  string
		want Header
	}{
		{adtA01, Header{
			SendingApplication:   "ADT1",
			SendingFacility:      "GOOD HEALTH HOSPITAL",
			ReceivingApplication: "GHH LAB, INC.",
			ReceivingFacility:    "GOOD HEALTH HOSPITAL",
			MessageType:          "ADT",
			TriggerEvent:         "A01",
			MessageStructure:     "ADT_A01",
			ControlID:            "MSG00001",
			ProcessingID:         "P",
			Version:              "2.5.1",
		}},
		{nonDefault, Header{
			SendingApplication:   "SENDER",
			SendingFacility:      "FAC",
			ReceivingApplication: "RECV",
			ReceivingFacility:    "RFAC",
			MessageType:          "ADT",
			TriggerEvent:         "A08",
			MessageStructure:     "ADT_A01",
			ControlID:            "CTRL-77",
			ProcessingID:         "T",
			Version:              "2.3",
		}},
		{seg(`MSH|^~\&`), Header{}},
	}
	for _, tt := range tests {
		m := mustParse(t, tt.raw)
		if got := m.Header(); got != tt.want {
			t.Errorf("Header()\n got: %+v\nwant: %+v", got, tt.want)
		}
	}
}

func TestMessageFormatsWithoutContent(t *testing.T) {
	t.Parallel()
	m := mustParse(t, adtA01)
	var logged strings.Builder
	slog.New(slog.NewTextHandler(&logged, nil)).Info("got", "msg", m)
	for _, out := range []string{
		fmt.Sprint(m), fmt.Sprintf("%v %+v %#v %s", m, m, m, m), logged.String(),
	} {
		if strings.Contains(out, "EVERYMAN") || strings.Contains(out, "PATID") {
			t.Errorf("formatting leaks content: %s", out)
		}
		if !strings.Contains(out, "ADT") {
			t.Errorf("formatting lost the message type: %s", out)
		}
	}
	if got := fmt.Sprint(m); got != "hl7.Message(ADT^A01, 5 segments)" {
		t.Errorf("String() = %q", got)
	}
	var nilMsg *Message
	if got := fmt.Sprint(nilMsg); got != "hl7.Message(nil)" {
		t.Errorf("nil String() = %q", got)
	}
}
