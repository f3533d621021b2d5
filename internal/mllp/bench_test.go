package mllp

import (
	"context"
	"strings"
	"testing"
)

// BenchmarkRoundTrip measures one message sent by a Client, handled by a
// Server and acknowledged, over loopback.
func BenchmarkRoundTrip(b *testing.B) {
	msg := []byte("MSH|^~\\&|SENDER|FAC|RECEIVER|FAC|20260101120000||ADT^A01|MSG00001|P|2.5\r" +
		"PID|1||123456^^^HOSP^MR||DOE^JOHN||19700101|M\r" + strings.Repeat("OBX|1|TX|||x\r", 10))
	ack := []byte("MSH|^~\\&|RECEIVER|FAC|SENDER|FAC|20260101120000||ACK|ACK00001|P|2.5\rMSA|AA|MSG00001\r")
	srv := &Server{Handler: HandlerFunc(func(context.Context, []byte, ConnInfo) []byte { return ack })}
	addr, _ := startServer(b, srv)
	c := &Client{Addr: addr}
	defer c.Close()
	ctx := context.Background()

	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
	}
}
