package mllp

import (
	"context"
	"crypto/tls"
	"strings"
	"testing"

	"github.com/mefor/mefor/internal/certtest"
)

// BenchmarkRoundTrip measures one message sent by a Client, handled by a
// Server and acknowledged, over loopback.
func BenchmarkRoundTrip(b *testing.B) {
	benchRoundTrip(b, nil, nil)
}

// BenchmarkRoundTripMutualTLS is BenchmarkRoundTrip over one mutual TLS
// connection (the handshake happens once, outside the loop): the cost of
// encryption per message, to compare with the plaintext figure of the same
// run.
func BenchmarkRoundTripMutualTLS(b *testing.B) {
	ca := certtest.NewCA(b, "Bench CA")
	server, client := ca.Issue(b, "server", certtest.Options{}), ca.Issue(b, "client", certtest.Options{})
	benchRoundTrip(b,
		&tls.Config{Certificates: []tls.Certificate{server.TLS}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: ca.Pool()},
		&tls.Config{Certificates: []tls.Certificate{client.TLS}, RootCAs: ca.Pool()})
}

func benchRoundTrip(b *testing.B, serverTLS, clientTLS *tls.Config) {
	msg := []byte("MSH|^~\\&|SENDER|FAC|RECEIVER|FAC|20260101120000||ADT^A01|MSG00001|P|2.5\r" +
		"PID|1||123456^^^HOSP^MR||DOE^JOHN||19700101|M\r" + strings.Repeat("OBX|1|TX|||x\r", 10))
	ack := []byte("MSH|^~\\&|RECEIVER|FAC|SENDER|FAC|20260101120000||ACK|ACK00001|P|2.5\rMSA|AA|MSG00001\r")
	srv := &Server{Handler: HandlerFunc(func(context.Context, []byte, ConnInfo) []byte { return ack }), TLSConfig: serverTLS}
	addr, _ := startServer(b, srv)
	c := &Client{Addr: addr}
	if clientTLS != nil {
		c.Dialer = TLSDialer(func() *tls.Config { return clientTLS })
	}
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
