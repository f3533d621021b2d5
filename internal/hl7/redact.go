package hl7

import (
	"log/slog"
	"strconv"
)

// String describes m without its content, so that a Message that ends up in
// a log line or an error through %v does not leak PHI. Encode gives the
// content.
func (m *Message) String() string {
	if m == nil {
		return "hl7.Message(nil)"
	}
	return "hl7.Message(" + m.describe() + ")"
}

// GoString keeps %#v from printing the fields and with them the content.
func (m *Message) GoString() string { return m.String() }

// LogValue makes slog log a description instead of the content.
func (m *Message) LogValue() slog.Value {
	if m == nil {
		return slog.StringValue("nil")
	}
	return slog.GroupValue(
		slog.String("type", m.MessageType()),
		slog.String("trigger", m.TriggerEvent()),
		slog.Int("segments", len(m.segments)),
	)
}

// describe names the message type and size, which are structure, not
// content.
func (m *Message) describe() string {
	s := m.MessageType()
	if t := m.TriggerEvent(); t != "" {
		s += "^" + t
	}
	if s != "" {
		s += ", "
	}
	return s + strconv.Itoa(len(m.segments)) + " segments"
}
