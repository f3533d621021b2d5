package handler

import (
	"context"
	"testing"

	"github.com/mefor/mefor/internal/hl7"
)

const adt = "MSH|^~\\&|ADT1|HOSP|LAB|HOSP|20240101120000||ADT^A01^ADT_A01|MSG1|P|2.5.1\r" +
	"PID|1||123^^^HOSP^MR~456^^^SSA^SS||DOE^JANE^Q||19700101|F\r" +
	"PV1|1|I|W1^101^A\r"

func parse(t testing.TB, raw string) *hl7.Message {
	t.Helper()
	m, err := hl7.Parse([]byte(raw))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return m
}

func TestPassthrough(t *testing.T) {
	t.Parallel()
	msg := parse(t, adt)
	got, err := Passthrough{}.Handle(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	if got != msg {
		t.Error("Passthrough returned a different message")
	}
	if string(got.Encode()) != adt {
		t.Error("Passthrough changed the message")
	}
}

func TestHandlerFunc(t *testing.T) {
	t.Parallel()
	var h Handler = HandlerFunc(func(_ context.Context, msg *hl7.Message) (*hl7.Message, error) {
		if msg.MessageType() != "ORU" {
			return nil, nil // filtered out
		}
		return msg, nil
	})
	got, err := h.Handle(context.Background(), parse(t, adt))
	if got != nil || err != nil {
		t.Errorf("Handle = %v, %v; want filtered", got, err)
	}
}
