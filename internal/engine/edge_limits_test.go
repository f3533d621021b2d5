package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/mllp"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// limitedConfig is testConfig with more keys in the listener's mllp block
// (", max_messages_per_second: 5", say).
func limitedConfig(t *testing.T, listen, listenerKeys, destinations string) *config.Config {
	t.Helper()
	channel := strings.Replace(fixtures.ADTChannel(listen), fmt.Sprintf(`mllp: {listen: "%s"}`, listen),
		fmt.Sprintf(`mllp: {listen: "%s"%s}`, listen, listenerKeys), 1)
	y := channel + fmt.Sprintf(`
      - name: out
        match: {message_type: [ADT]}
        destinations: [%s]
destinations:
%s`, destNames(destinations), destinations)
	cfg, err := config.Parse("test.yaml", []byte(y), nil)
	if err != nil {
		t.Fatalf("test config: %v\n%s", err, y)
	}
	return cfg
}

// counter is the node's counter name with exactly labels; -1 when absent.
func counter(t *testing.T, n *engine.Node, name string, labels ...string) float64 {
	t.Helper()
	return value(gatherMetrics(t, n), name, labels...)
}

// junk is an unparseable frame of size bytes, different for each i, so
// that a stored prefix can be matched to the frame it came from.
func junk(i, size int) []byte {
	b := []byte(fmt.Sprintf("JUNK %03d ", i))
	for len(b) < size {
		b = append(b, byte('a'+len(b)%26))
	}
	return b[:size]
}

// sendUntilClosed sends frames on one connection, each after the previous
// one's answer, and returns the answers it got before the server closed
// the connection (or all of them).
func sendUntilClosed(t *testing.T, addr string, frames [][]byte) (acks []hl7.Ack, closed bool, local string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(2 * time.Minute)); err != nil {
		t.Fatal(err)
	}
	r := mllp.NewReader(conn, 0)
	for _, f := range frames {
		if err := mllp.WriteFrame(conn, f); err != nil {
			return acks, true, conn.LocalAddr().String()
		}
		raw, err := r.ReadFrame()
		if err != nil {
			return acks, true, conn.LocalAddr().String()
		}
		ack, err := hl7.ParseACK(raw)
		if err != nil {
			t.Fatalf("answer %d is not an ACK: %v", len(acks)+1, err)
		}
		acks = append(acks, ack)
	}
	return acks, false, conn.LocalAddr().String()
}

// A sender of junk: 25 unparseable frames of 100 KiB on one connection get
// 20 ARs (max_unparseable_in_a_row, default 20), then the connection is
// closed. The 20 are stored for inspection cut to their first 64 KiB
// (keep_unparseable's default) with their full 100 KiB recorded; the close
// is counted and logged once with the sender's address and no content.
// Another connection is served as before, and one whose junk is broken by
// a message that parses keeps going.
func TestJunkFramesCutAndConnectionClosed(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	logs := &fixtures.SyncBuffer{}
	node, p, listen := startDownstream(t, db, nil, func(o *engine.Options) {
		o.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})

	const size, keep = 100 << 10, 64 << 10
	var frames [][]byte
	for i := range 25 {
		frames = append(frames, junk(i, size))
	}
	acks, closed, sender := sendUntilClosed(t, listen, frames)
	if len(acks) != 20 || !closed {
		t.Fatalf("25 junk frames: %d answers, connection closed %v; want 20 ARs, then closed", len(acks), closed)
	}
	for i, a := range acks {
		if a.Code != hl7.AckReject {
			t.Fatalf("junk frame %d answered %s, want AR", i+1, a.Code)
		}
	}

	rows, err := db.Pool.Query(context.Background(), `
		SELECT id, status, size, coalesce(cut_at, 0), raw FROM mefor_message ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	type stored struct {
		id          int64
		status      string
		size, cutAt int
		raw         []byte
	}
	var got []stored
	for rows.Next() {
		var s stored
		if err := rows.Scan(&s.id, &s.status, &s.size, &s.cutAt, &s.raw); err != nil {
			t.Fatal(err)
		}
		got = append(got, s)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 20 {
		t.Fatalf("%d messages stored, want the 20 answered", len(got))
	}
	for i, s := range got {
		if s.status != "error" || s.size != size || s.cutAt != keep || !bytes.Equal(s.raw, frames[i][:keep]) {
			t.Fatalf("message %d: status %s, size %d, cut at %d, %d bytes kept (the frame's first %d: %v); want error, %d, %d, its first %d bytes",
				i+1, s.status, s.size, s.cutAt, len(s.raw), keep, bytes.Equal(s.raw, frames[i][:min(keep, len(s.raw))]), size, keep, keep)
		}
	}
	// Where an operator inspects the message, the cut shows.
	v, err := ops.ShowMessage(context.Background(), db.Pool, nil, got[0].id, true)
	if err != nil {
		t.Fatal(err)
	}
	if v.Message.Size != size || v.Message.CutAt != keep || len(v.Message.Raw) != keep {
		t.Fatalf("messages show: size %d, cut at %d, %d body bytes; want %d, %d, %d", v.Message.Size, v.Message.CutAt, len(v.Message.Raw), size, keep, keep)
	}
	list, err := ops.ListMessages(context.Background(), db.Pool, ops.MessageFilter{Status: "error"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 20 || list[0].CutAt != keep || list[0].Size != size {
		t.Fatalf("messages list: %+v; want 20 messages cut at %d of %d bytes", list, keep, size)
	}

	if n := counter(t, node, "mefor_connections_closed_total", "channel", "adt", "reason", "unparseable-in-a-row"); n != 1 {
		t.Fatalf("mefor_connections_closed_total{reason=unparseable-in-a-row} = %v, want 1", n)
	}
	if n := counter(t, node, "mefor_messages_rejected_total", "channel", "adt", "reason", "unparseable"); n != 20 {
		t.Fatalf("mefor_messages_rejected_total{reason=unparseable} = %v, want 20", n)
	}
	text := logs.String()
	var closes []string
	for _, line := range strings.Split(text, "\n") {
		if strings.Contains(line, "too many unparseable frames in a row") {
			closes = append(closes, line)
		}
	}
	if len(closes) != 1 || !strings.Contains(closes[0], "remote="+sender) {
		t.Fatalf("log lines about the close: %q; want one naming the sender %s", closes, sender)
	}
	if strings.Contains(text, "JUNK") || strings.Contains(text, "abcdefgh") {
		t.Fatal("the node's log holds message content")
	}

	// Another connection is served; a message that parses resets the count.
	var mixed [][]byte
	for i := range 19 {
		mixed = append(mixed, junk(100+i, 16))
	}
	mixed = append(mixed, adt("OK1", "P1"))
	for i := range 19 {
		mixed = append(mixed, junk(200+i, 16))
	}
	mixed = append(mixed, adt("OK2", "P2"))
	acks, closed, _ = sendUntilClosed(t, listen, mixed)
	if closed || len(acks) != len(mixed) {
		t.Fatalf("19 junk frames, a message, 19 junk, a message: %d answers, closed %v; want all %d, open", len(acks), closed, len(mixed))
	}
	if acks[19].Code != hl7.AckAccept || acks[39].Code != hl7.AckAccept {
		t.Fatalf("the messages that parse answered %s and %s, want AA", acks[19].Code, acks[39].Code)
	}
	fixtures.Eventually(t, 20*time.Second, "both messages delivered", func() bool {
		return slices.Equal(p.acceptedIDs(), []string{"OK1", "OK2"})
	})
	if n := counter(t, node, "mefor_connections_closed_total", "channel", "adt", "reason", "unparseable-in-a-row"); n != 1 {
		t.Fatalf("mefor_connections_closed_total after the second connection = %v, want still 1", n)
	}
}

// max_messages_per_second slows a sender down by reading more slowly: at
// 5/s (a burst of 5, then one every 200ms) 20 messages sent back to back
// take at least 3s as the sender measures them. Every one is answered AA,
// stored once and delivered in order: nothing already stored is refused.
func TestMaxMessagesPerSecondSlowsSender(t *testing.T) {
	t.Parallel()
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	listen := fixtures.FreeAddr(t)
	node := cluster.StartNode(t, db, limitedConfig(t, listen, ", max_messages_per_second: 5", downstream(p.addr)), nil)

	var msgs [][]byte
	var want []string
	for i := range 20 {
		id := fmt.Sprintf("R%02d", i)
		msgs = append(msgs, adt(id, "P1"))
		want = append(want, id)
	}
	start := time.Now()
	acks := send(t, listen, msgs...)
	elapsed := time.Since(start)
	for i, a := range acks {
		if a.Code != hl7.AckAccept || a.ControlID != want[i] {
			t.Fatalf("message %d answered %s for %s, want AA for %s", i, a.Code, a.ControlID, want[i])
		}
	}
	if elapsed < 3*time.Second {
		t.Fatalf("20 messages at 5/s took %s, want at least 3s", elapsed)
	}
	if got := queryStrings(t, db, `SELECT control_id FROM mefor_message ORDER BY id`); !slices.Equal(got, want) {
		t.Fatalf("stored %v, want each of %v once, in order", got, want)
	}
	fixtures.Eventually(t, 30*time.Second, "all 20 delivered", func() bool { return len(p.acceptedIDs()) == 20 })
	if got := p.acceptedIDs(); !slices.Equal(got, want) {
		t.Fatalf("delivered %v, want %v", got, want)
	}
	if s := counter(t, node, "mefor_intake_paced_seconds_total", "channel", "adt"); s < 1 {
		t.Fatalf("mefor_intake_paced_seconds_total = %v, want the waits (about 3s) counted", s)
	}
	if n := counter(t, node, "mefor_messages_rejected_total", "channel", "adt", "reason", "not-stored"); n > 0 {
		t.Fatalf("%v messages refused under the rate", n)
	}
}
