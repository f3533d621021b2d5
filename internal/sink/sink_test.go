package sink

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

const adt = "MSH|^~\\&|HIS|HOSP|LAB|HOSP|20250301120000||ADT^A01|C/1|P|2.5\rPID|1||12345^^^HOSP^MR||DOE^JANE\r"

// A sink answers a message with its configured code, keeps it under a
// file name safe for any control id, and reports it; a message that does
// not parse is answered AR and reported with its error.
func TestSinkAnswersKeepsAndReports(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "out")
	var mu sync.Mutex
	var got []Received
	s, err := New(Config{Dir: dir, Ack: hl7.AckError, Report: func(r Received) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, r)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln, nil) }()

	c := &mllp.Client{Addr: ln.Addr().String()}
	defer c.Close()
	for _, tc := range []struct {
		msg  string
		want hl7.AckCode
	}{{adt, hl7.AckError}, {"not hl7", hl7.AckReject}} {
		raw, err := c.Send(context.Background(), []byte(tc.msg))
		if err != nil {
			t.Fatal(err)
		}
		ack, err := hl7.ParseACK(raw)
		if err != nil || ack.Code != tc.want {
			t.Fatalf("answered %+v (%v), want %s", ack, err, tc.want)
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("Serve: %v", err)
	}

	if s.Count() != 2 {
		t.Fatalf("counted %d messages, want 2", s.Count())
	}
	data, err := os.ReadFile(filepath.Join(dir, "00000001-C_1.hl7"))
	if err != nil || string(data) != adt {
		t.Fatalf("kept %q (%v), want the message as sent", data, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 || got[0].ControlID != "C/1" || got[0].MessageType != "ADT" || got[0].TriggerEvent != "A01" ||
		got[1].Seq != 2 || got[1].ParseErr == nil {
		t.Fatalf("reported %+v", got)
	}
}
