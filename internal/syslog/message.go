package syslog

import (
	"bytes"
	"fmt"
	"strings"
	"time"
)

// Severities used by mefor (RFC 5424 6.2.1).
const (
	SeverityError   = 3
	SeverityWarning = 4
	SeverityNotice  = 5
	SeverityInfo    = 6
)

// StructuredDataID names mefor's structured data element; 32473 is the
// private enterprise number set aside for examples (RFC 5612), as no
// number is registered for mefor.
const StructuredDataID = "mefor@32473"

// Message is one RFC 5424 message.
type Message struct {
	// Facility is 0 to 23, Severity 0 to 7.
	Facility, Severity int
	Time               time.Time
	// Hostname, AppName and MsgID are header fields; each is made
	// printable US-ASCII without spaces, "-" when empty.
	Hostname, AppName, MsgID string
	// Params are the parameters of one structured data element,
	// StructuredDataID, in order; none gives "-".
	Params []Param
	// Msg is the free-form message, after the structured data.
	Msg []byte
}

// Param is one structured data parameter; its value is escaped when
// written.
type Param struct{ Name, Value string }

// Bytes formats m.
func (m Message) Bytes() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "<%d>1 %s %s %s - %s ", m.Facility*8+m.Severity, m.Time.UTC().Format("2006-01-02T15:04:05.000000Z"),
		Header(m.Hostname), Header(m.AppName), Header(m.MsgID))
	if len(m.Params) == 0 {
		b.WriteByte('-')
	} else {
		b.WriteString("[" + StructuredDataID)
		for _, p := range m.Params {
			b.WriteString(" " + p.Name + `="` + sdEscape(p.Value) + `"`)
		}
		b.WriteByte(']')
	}
	if len(m.Msg) > 0 {
		b.WriteByte(' ')
		b.Write(m.Msg)
	}
	return b.Bytes()
}

// Header makes v a valid RFC 5424 header field: printable US-ASCII without
// spaces, "-" when empty.
func Header(v string) string {
	v = strings.Map(func(r rune) rune {
		if r < 33 || r > 126 {
			return -1
		}
		return r
	}, v)
	if v == "" {
		return "-"
	}
	return v
}

// sdEscape escapes a structured data parameter value (RFC 5424 6.3.3).
func sdEscape(v string) string {
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, `]`, `\]`).Replace(v)
}

// P is Param{Name: name, Value: value}.
func P(name, value string) Param { return Param{Name: name, Value: value} }
