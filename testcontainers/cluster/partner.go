package cluster

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
)

// Partner is the downstream system of every destination, in this process, so
// it sees every delivery including repeats.
type Partner struct {
	Addr string
	mu   sync.Mutex
	got  []Delivery
}

// Delivery is one message the Partner received, with when.
type Delivery struct {
	ID string
	At time.Time
}

// NewPartner listens on a loopback port and acknowledges every message AA.
func NewPartner(t *testing.T) *Partner {
	t.Helper()
	p := &Partner{}
	p.Addr = ServeMLLP(t, "127.0.0.1:0", func(_ context.Context, m *hl7.Message) []byte {
		p.mu.Lock()
		p.got = append(p.got, Delivery{ID: m.ControlID(), At: time.Now()})
		p.mu.Unlock()
		time.Sleep(2 * time.Millisecond) // a partner that takes a moment, so failures land mid-delivery
		return ACK(m, hl7.AckAccept, "")
	})
	return p
}

// ServeMLLP serves a downstream system over MLLP on addr ("127.0.0.1:0"
// for a free port) until the test ends, and returns the address it
// listens on. answer gets every message that parses, with the context of
// its connection, and returns the reply (nil sends none); a frame that does
// not parse is answered AR.
func ServeMLLP(t testing.TB, addr string, answer func(ctx context.Context, m *hl7.Message) []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := &mllp.Server{Handler: mllp.HandlerFunc(func(ctx context.Context, raw []byte, _ mllp.ConnInfo) []byte {
		m, err := hl7.Parse(raw)
		if err != nil {
			return hl7.NewACKForUnparsed(raw, hl7.AckReject, "unparseable", hl7.NewControlID(), time.Now())
		}
		return answer(ctx, m)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return ln.Addr().String()
}

// ACK is a partner's acknowledgment of m with code and text.
func ACK(m *hl7.Message, code hl7.AckCode, text string) []byte {
	return hl7.NewACK(m, code, text, hl7.NewControlID(), time.Now())
}

// Deliveries lists what the Partner received so far, repeats included.
func (p *Partner) Deliveries() []Delivery {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.got)
}

// DeliveredAllBy is the time by which every id in want had been delivered
// at least once, and whether it has been.
func (p *Partner) DeliveredAllBy(want []string) (time.Time, bool) {
	first := map[string]time.Time{}
	for _, d := range p.Deliveries() {
		if _, ok := first[d.ID]; !ok {
			first[d.ID] = d.At
		}
	}
	var last time.Time
	for _, id := range want {
		at, ok := first[id]
		if !ok {
			return time.Time{}, false
		}
		if at.After(last) {
			last = at
		}
	}
	return last, true
}
