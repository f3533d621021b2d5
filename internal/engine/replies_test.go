package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/engine"
	"github.com/mefor/mefor/internal/hl7"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/internal/search"
	"github.com/mefor/mefor/ops"
	"github.com/mefor/mefor/testcontainers"
	"github.com/mefor/mefor/testcontainers/cluster"
	"github.com/mefor/mefor/testcontainers/fixtures"
)

// replyRow is a message stored from a reply, with its parent's control id.
type replyRow struct {
	id, parent          int64
	parentCtl, status   string
	depth               int
	source, errorReason string
}

func replyRows(t *testing.T, db *testcontainers.DB, channel string) []replyRow {
	t.Helper()
	return queryRows(t, db, func(row pgx.CollectableRow) (replyRow, error) {
		var r replyRow
		err := row.Scan(&r.id, &r.parent, &r.parentCtl, &r.status, &r.depth, &r.source, &r.errorReason)
		return r, err
	}, `
		SELECT m.id, coalesce(m.parent_id, 0), coalesce(p.control_id, ''), m.status, m.reply_depth, m.source, coalesce(m.error, '')
		FROM mefor_message m LEFT JOIN mefor_message p ON p.id = m.parent_id
		WHERE m.channel = $1 ORDER BY m.id`, channel)
}

// repliesArchived is a config whose orders channel (listening at the first
// address) delivers to a partner (the second) whose ACKs come back into
// the replies channel, which archives them in a directory (the third).
const repliesArchived = `
cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  orders:
    inbound: {mllp: {listen: %q}}
    routes: [{destinations: [lab]}]
  replies:
    routes: [{destinations: [archive]}]
destinations:
  lab:
    type: mllp
    mllp: {address: %q}
    reply_to: replies
  archive:
    type: file
    file: {directory: %q}
`

// A partner's ACKs are stored as messages of the replies channel, linked to
// the orders they answer, routed like any message (here to an archive) and
// shown both ways by messages show.
func TestMLLPRepliesRoutedIntoChannelAndArchived(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	listen, archive := fixtures.FreeAddr(t), t.TempDir()
	cluster.StartNode(t, db, parseConfig(t, fmt.Sprintf(repliesArchived, listen, p.addr, archive)), nil)

	send(t, listen, adt("O1", "P1"), adt("O2", "P2"), adt("O3", "P3"))
	fixtures.Eventually(t, 20*time.Second, "three replies archived", func() bool {
		entries, _ := os.ReadDir(archive)
		return len(entries) >= 3
	})
	fixtures.Eventually(t, 10*time.Second, "replies processed", func() bool {
		rs := replyRows(t, db, "replies")
		return len(rs) == 3 && !slices.ContainsFunc(rs, func(r replyRow) bool { return r.status != "processed" })
	})
	rs := replyRows(t, db, "replies")
	for i, r := range rs {
		if want := fmt.Sprintf("O%d", i+1); r.parentCtl != want || r.depth != 1 || r.source != "reply" {
			t.Fatalf("reply %d: %+v, want the reply to %s, one deep, source reply", i, r, want)
		}
		raw, err := os.ReadFile(filepath.Join(archive, fmt.Sprintf("%d.hl7", r.id)))
		if err != nil {
			t.Fatal(err)
		}
		ack, err := hl7.ParseACK(raw)
		if err != nil || ack.Code != hl7.AckAccept || ack.ControlID != r.parentCtl {
			t.Fatalf("archived reply %d: %v %+v, want the partner's AA to %s", r.id, err, ack, r.parentCtl)
		}
	}

	ctx := context.Background()
	parent, err := ops.ShowMessage(ctx, db.Pool, nil, rs[0].parent, false)
	if err != nil {
		t.Fatal(err)
	}
	if got := parent.Origin.Replies; len(got) != 1 || got[0].ID != rs[0].id || got[0].Channel != "replies" || got[0].Destination != "lab" {
		t.Fatalf("parent's replies %+v", got)
	}
	var replied string
	for _, e := range parent.Events {
		if e.Event == "replied" {
			replied = e.Detail
		}
	}
	if want := fmt.Sprintf("reply stored as message %d of channel replies", rs[0].id); replied != want {
		t.Fatalf("parent's replied event %q, want %q", replied, want)
	}
	child, err := ops.ShowMessage(ctx, db.Pool, nil, rs[0].id, false)
	if err != nil {
		t.Fatal(err)
	}
	if pr := child.Origin.Parent; pr == nil || pr.ID != rs[0].parent || pr.ControlID != "O1" || pr.Destination != "lab" || child.Origin.ReplyDepth != 1 {
		t.Fatalf("reply's parent %+v, depth %d", pr, child.Origin.ReplyDepth)
	}
}

// A channel that sends to a partner whose replies come back into it is a
// loop: it stops at the depth limit (8 by default), the last reply recorded
// with the reason and not routed.
func TestReplyLoopStopsAtDepthLimit(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	listen := fixtures.FreeAddr(t)
	cluster.StartNode(t, db, parseConfig(t, fmt.Sprintf(`
cluster: {heartbeat: 1s, fence_timeout: 3s, lease_ttl: 5s}
channels:
  loop:
    inbound: {mllp: {listen: %q}}
    routes: [{destinations: [echo]}]
destinations:
  echo:
    type: mllp
    mllp: {address: %q}
    reply_to: loop
`, listen, p.addr)), nil)

	send(t, listen, adt("L0", "P1"))
	fixtures.Eventually(t, 30*time.Second, "the chain to end", func() bool { return len(replyRows(t, db, "loop")) >= 10 })
	time.Sleep(500 * time.Millisecond) // nothing may follow
	rs := replyRows(t, db, "loop")
	if len(rs) != 10 {
		t.Fatalf("%d messages in the loop channel, want the original and 9 replies", len(rs))
	}
	for i, r := range rs {
		if r.depth != i || (i > 0 && r.parent != rs[i-1].id) {
			t.Fatalf("message %d: %+v, want depth %d replying to %d", i, r, i, rs[max(i-1, 0)].id)
		}
	}
	last := rs[9]
	if last.status != "error" || !strings.Contains(last.errorReason, "past reply_depth_limit 8") {
		t.Fatalf("the 9th reply: %+v, want recorded with status error and the reason", last)
	}
	var work int
	db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM mefor_work WHERE message_id = $1`, last.id).Scan(&work)
	if work != 0 {
		t.Fatalf("the reply past the limit has %d stage rows; want none (not routed)", work)
	}
	if got := len(p.receivedIDs()); got != 9 {
		t.Fatalf("partner received %d messages, want 9 (the original and 8 replies)", got)
	}
	v, err := ops.ShowMessage(context.Background(), db.Pool, nil, rs[8].id, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(v.Events, func(e search.Event) bool {
		return e.Event == "replied" && strings.Contains(e.Detail, "not routed: past reply_depth_limit 8")
	}) {
		t.Fatalf("depth-8 message's events %+v lack the not-routed reply", v.Events)
	}
}

// With encryption on, a reply routed back in is a message whose body is
// sealed bound to its own id, drawn in its delivery record's transaction:
// it opens at each of its stages, and the archive gets the partner's ACK.
func TestRepliesRoutedBackInAreSealedToTheirMessage(t *testing.T) {
	db := testcontainers.NewDB(t)
	p := newPartner(t, "", nil)
	listen, archive := fixtures.FreeAddr(t), t.TempDir()
	kr := fixtures.Keyring(t, "k1")
	cluster.StartNode(t, db, parseConfig(t, fmt.Sprintf(repliesArchived, listen, p.addr, archive)), func(o *engine.Options) { o.Keys = kr })

	send(t, listen, adt("O1", "P1"), adt("O2", "P2"))
	fixtures.Eventually(t, 20*time.Second, "two replies archived", func() bool {
		rs := replyRows(t, db, "replies")
		return len(rs) == 2 && !slices.ContainsFunc(rs, func(r replyRow) bool { return r.status != "processed" })
	})
	for _, r := range replyRows(t, db, "replies") {
		var raw []byte
		if err := db.Pool.QueryRow(context.Background(), `SELECT raw FROM mefor_message WHERE id = $1`, r.id).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		if _, err := kr.Open(pipeline.ColRaw, pipeline.MessageRow(r.id), raw); err != nil || !bytes.HasPrefix(raw, crypt.BinaryHeader("k1")) {
			t.Fatalf("reply %d's stored body is not sealed to its message: %v", r.id, err)
		}
		got, err := os.ReadFile(filepath.Join(archive, fmt.Sprintf("%d.hl7", r.id)))
		if err != nil {
			t.Fatal(err)
		}
		if ack, err := hl7.ParseACK(got); err != nil || ack.Code != hl7.AckAccept || ack.ControlID != r.parentCtl {
			t.Fatalf("archived reply %d: %v %+v", r.id, err, ack)
		}
	}
}
