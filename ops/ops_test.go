package ops_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/ops"
)

const lab = "outbound:lab"

// A dead delivery replayed goes back to pending at the BACK of its lane
// (behind the rows queued meanwhile), reset, with a live drainer, and the
// message leaves error.
func TestReplayDeadDeliveryGoesToBackOfLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.toOutbound("adt", lab)
	b := e.toOutbound("adt", lab)
	c := e.toOutbound("adt", lab)
	e.fail(lab, a, true, 0)
	if got := e.status(a); got != pipeline.StatusError {
		t.Fatalf("dead message status = %s, want error", got)
	}

	res := e.replay(a)
	if res.Rows != 1 || res.Mode != pipeline.ReplayRecover || res.Status != pipeline.StatusRouted {
		t.Fatalf("replay = %+v, want 1 row recovered, status routed", res)
	}
	ra, rb, rc := e.row(a, "outbound"), e.row(b, "outbound"), e.row(c, "outbound")
	if ra.status != pipeline.WorkPending || ra.attempts != 0 || ra.lastError != nil || !ra.due {
		t.Fatalf("replayed row = %+v, want pending, 0 attempts, no error, due", ra)
	}
	if ra.seq <= rb.seq || ra.seq <= rc.seq {
		t.Fatalf("replayed row seq %d is not behind the queued rows (%d, %d)", ra.seq, rb.seq, rc.seq)
	}
	if _, state := e.drainerState(lab); state != "available" {
		t.Fatalf("lane drainer is %s, want available", state)
	}
	if got := e.queryStr("SELECT coalesce(error, '') FROM mefor_message WHERE id = $1", a); got != "" {
		t.Fatalf("message error = %q, want cleared", got)
	}
	if n := e.events(a, pipeline.EventReplayed); n != 1 {
		t.Fatalf("%d replayed events, want 1", n)
	}
}

// A lane whose drainer finished (lane was empty) gets a new drainer when a
// replay puts a row back into it.
func TestReplayActivatesFinishedLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.toOutbound("adt", lab)
	e.fail(lab, a, true, 0)
	old := e.finishDrainer(lab)

	e.replay(a)
	id, state := e.drainerState(lab)
	if id == old || state != "available" {
		t.Fatalf("lane drainer = job %d %s, want a new available job (old %d)", id, state, old)
	}
}

// A fully processed message is replayed by re-sending its delivered
// outbound rows only: ingress and routed rows stay done, cancelled rows stay
// cancelled.
func TestReplayProcessedMessageResendsOnlyDeliveries(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.toOutbound("adt", lab, "outbound:archive")
	other := e.toOutbound("adt", lab) // queued behind m in lab
	e.deliver(lab, m)
	e.cancel(pipeline.CancelFilter{Destination: "archive"}, ops.BulkOptions{})
	if got := e.status(m); got != pipeline.StatusProcessed {
		t.Fatalf("status before replay = %s, want processed", got)
	}
	e.finishDrainer(lab)

	res := e.replay(m)
	if res.Rows != 1 || res.Mode != pipeline.ReplayResend || res.Status != pipeline.StatusRouted {
		t.Fatalf("replay = %+v, want 1 row re-sent, status routed", res)
	}
	for _, w := range e.rows(m) {
		want := map[string]string{"ingress": "done", "routed": "done"}[w.stage]
		switch {
		case w.lane == lab:
			want = "pending"
		case w.lane == "outbound:archive":
			want = "cancelled"
		}
		if w.status != want {
			t.Fatalf("row %d (%s, %s) is %s, want %s", w.id, w.stage, w.lane, w.status, want)
		}
	}
	resent := e.rowIn(m, lab)
	if queued := e.row(other, "outbound"); resent.seq <= queued.seq {
		t.Fatalf("re-sent row seq %d is not behind queued row %d", resent.seq, queued.seq)
	}
	if _, state := e.drainerState(lab); state != "available" {
		t.Fatalf("lane drainer is %s, want available", state)
	}
}

// A pending head waiting out a backoff keeps its place when replayed, is due
// at once, and its snoozed drainer is woken.
func TestReplayPendingHeadKeepsPlaceAndWakesLane(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.toOutbound("adt", lab)
	b := e.toOutbound("adt", lab)
	job := e.blockHead(lab, a)
	before := e.row(a, "outbound")
	if before.attempts != 1 || before.due {
		t.Fatalf("head before replay = %+v, want 1 attempt, not due", before)
	}

	res := e.replay(a)
	if res.Rows != 1 || res.Mode != pipeline.ReplayRecover {
		t.Fatalf("replay = %+v, want 1 row recovered", res)
	}
	after := e.row(a, "outbound")
	if after.seq != before.seq || after.seq >= e.row(b, "outbound").seq {
		t.Fatalf("pending head moved: seq %d → %d (next row %d)", before.seq, after.seq, e.row(b, "outbound").seq)
	}
	if after.attempts != 0 || !after.due || after.lastError != nil {
		t.Fatalf("head after replay = %+v, want 0 attempts, due, no error", after)
	}
	id, state := e.drainerState(lab)
	if id != job || state != "available" {
		t.Fatalf("drainer = job %d %s, want job %d woken to available", id, state, job)
	}
	if n := e.queryInt("SELECT count(*) FROM river_job WHERE state = 'available' AND kind = 'mefor_outbound'"); n != 1 {
		t.Fatalf("%d available outbound drainers, want exactly 1", n)
	}
}

// A message that was never routed anywhere has nothing to replay: nothing
// changes, no event. An unknown id and a purged body are errors.
func TestReplayNothingUnknownAndPurged(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.receive("adt")
	row := e.pendingRow("ingress:adt", m)
	e.tx(func(tx pgx.Tx) error { return pipeline.RouteHandoff(e.ctx, tx, e.q, row, nil) }) // unrouted

	res := e.replay(m)
	if res.Rows != 0 || res.Mode != "" || res.Status != pipeline.StatusUnrouted {
		t.Fatalf("replay = %+v, want nothing done, status unrouted", res)
	}
	if n := e.events(m, pipeline.EventReplayed); n != 0 {
		t.Fatalf("%d replayed events for a no-op replay", n)
	}
	if got := e.row(m, "ingress").status; got != pipeline.WorkDone {
		t.Fatalf("consumed ingress row is %s after replay, want done", got)
	}

	if _, err := ops.Replay(e.ctx, e.db.Pool, 999999); !errors.Is(err, pipeline.ErrNotFound) {
		t.Fatalf("replay of unknown id: %v, want ErrNotFound", err)
	}

	p := e.toOutbound("adt", lab)
	e.fail(lab, p, true, 0)
	e.exec("UPDATE mefor_message SET raw = NULL, body_purged_at = now() WHERE id = $1", p)
	if _, err := ops.Replay(e.ctx, e.db.Pool, p); !errors.Is(err, pipeline.ErrBodyPurged) {
		t.Fatalf("replay of purged message: %v, want ErrBodyPurged", err)
	}
	if got := e.row(p, "outbound").status; got != pipeline.WorkDead {
		t.Fatalf("purged message row is %s, want still dead", got)
	}
}

// A dead ingress row (e.g. its channel left the config) replayed puts the
// message back to received.
func TestReplayDeadIngressRowBackToReceived(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.receive("adt")
	row := e.pendingRow("ingress:adt", m)
	e.tx(func(tx pgx.Tx) error { return pipeline.DeadLetter(e.ctx, tx, pipeline.NoFence, row, "channel gone") })
	if got := e.status(m); got != pipeline.StatusError {
		t.Fatalf("status = %s, want error", got)
	}
	res := e.replay(m)
	if res.Rows != 1 || res.Status != pipeline.StatusReceived {
		t.Fatalf("replay = %+v, want 1 row, status received", res)
	}
}

// Cancel turns every pending delivery of a destination (all lanes, all
// channels) into cancelled, records an event each, and finalizes the
// messages; other destinations are untouched.
func TestCancelFinalizesMessages(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m1 := e.toOutbound("adt", "outbound:lab#0", "outbound:archive")
	m2 := e.toOutbound("orm", "outbound:lab#1")
	m3 := e.toOutbound("adt", "outbound:lab#0")
	e.deliver("outbound:archive", m1)
	keep := e.toOutbound("adt", "outbound:archive")

	res := e.cancel(pipeline.CancelFilter{Destination: "lab"}, ops.BulkOptions{BatchSize: 2})
	if res.Matched != 3 || res.Rows != 3 {
		t.Fatalf("cancel = %+v, want 3 matched and cancelled", res)
	}
	for _, m := range []int64{m1, m2, m3} {
		if got := e.status(m); got != pipeline.StatusProcessed {
			t.Fatalf("message %d is %s after cancel, want processed", m, got)
		}
		if n := e.events(m, pipeline.EventCancelled); n != 1 {
			t.Fatalf("message %d has %d cancelled events, want 1", m, n)
		}
	}
	if got := e.row(keep, "outbound").status; got != pipeline.WorkPending {
		t.Fatalf("archive delivery is %s, want pending", got)
	}
	if got := e.status(keep); got != pipeline.StatusRouted {
		t.Fatalf("untouched message is %s, want routed", got)
	}
}

// --channel narrows a cancel to one channel's deliveries.
func TestCancelByChannel(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a := e.toOutbound("adt", lab)
	o := e.toOutbound("orm", lab)
	res := e.cancel(pipeline.CancelFilter{Destination: "lab", Channel: "orm"}, ops.BulkOptions{})
	if res.Rows != 1 || e.row(o, "outbound").status != pipeline.WorkCancelled || e.row(a, "outbound").status != pipeline.WorkPending {
		t.Fatalf("cancel --channel orm = %+v; adt row %s, orm row %s", res,
			e.row(a, "outbound").status, e.row(o, "outbound").status)
	}
}

// --top on a multi-lane destination cancels only the failing head of each
// blocked lane, wakes that lane's snoozed drainer, and leaves healthy lanes
// and the rows behind the head alone.
func TestCancelTopOnlyFailingHeads(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const l0, l1 = "outbound:lab#0", "outbound:lab#1"
	stuck := e.toOutbound("adt", l0)
	behind := e.toOutbound("adt", l0)
	healthy := e.toOutbound("adt", l1)
	job := e.blockHead(l0, stuck)

	res := e.cancel(pipeline.CancelFilter{Destination: "lab", Top: true}, ops.BulkOptions{})
	if res.Matched != 1 || res.Rows != 1 {
		t.Fatalf("cancel --top = %+v, want the one failing head", res)
	}
	if got := e.row(stuck, "outbound").status; got != pipeline.WorkCancelled {
		t.Fatalf("failing head is %s, want cancelled", got)
	}
	if got := e.status(stuck); got != pipeline.StatusProcessed {
		t.Fatalf("cancelled head's message is %s, want processed", got)
	}
	for _, m := range []int64{behind, healthy} {
		if got := e.row(m, "outbound").status; got != pipeline.WorkPending {
			t.Fatalf("message %d row is %s, want pending", m, got)
		}
	}
	if id, state := e.drainerState(l0); id != job || state != "available" {
		t.Fatalf("blocked lane's drainer = %d %s, want %d woken", id, state, job)
	}

	// No lane blocked now: --top cancels nothing.
	if res := e.cancel(pipeline.CancelFilter{Destination: "lab", Top: true}, ops.BulkOptions{}); res.Rows != 0 {
		t.Fatalf("second cancel --top = %+v; want nothing cancelled", res)
	}
}

// replay-dead re-queues every matching dead delivery, in batches, reporting
// progress, leaving other destinations' dead rows; a declined confirmation
// changes nothing.
func TestReplayDeadInBatches(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	var labDead, archDead []int64
	for i := range 5 {
		ch := "adt"
		if i%2 == 1 {
			ch = "orm"
		}
		m := e.toOutbound(ch, lab)
		e.fail(lab, m, true, 0)
		labDead = append(labDead, m)
	}
	queued := e.toOutbound("adt", lab)
	for range 2 {
		m := e.toOutbound("adt", "outbound:archive")
		e.fail("outbound:archive", m, true, 0)
		archDead = append(archDead, m)
	}

	declined, err := ops.ReplayDead(e.ctx, e.db.Pool, pipeline.DeadFilter{Destination: "lab"}, ops.BulkOptions{
		Confirm: func(n int) (bool, error) {
			if n != 5 {
				t.Errorf("confirm asked for %d rows, want 5", n)
			}
			return false, nil
		},
	})
	if err != nil || !declined.Declined || declined.Rows != 0 {
		t.Fatalf("declined replay-dead = %+v, %v", declined, err)
	}
	if n := e.queryInt("SELECT count(*) FROM mefor_work WHERE status = 'dead'"); n != 7 {
		t.Fatalf("%d dead rows after a declined replay, want 7", n)
	}

	var progress [][2]int
	res, err := ops.ReplayDead(e.ctx, e.db.Pool, pipeline.DeadFilter{Destination: "lab"}, ops.BulkOptions{
		BatchSize: 2,
		Progress:  func(done, total int) { progress = append(progress, [2]int{done, total}) },
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Matched != 5 || res.Rows != 5 || res.Messages != 5 {
		t.Fatalf("replay-dead = %+v, want 5 rows of 5 messages", res)
	}
	if want := [][2]int{{2, 5}, {4, 5}, {5, 5}}; !slices.Equal(progress, want) {
		t.Fatalf("progress = %v, want %v", progress, want)
	}
	q := e.row(queued, "outbound")
	var prev int64
	for _, m := range labDead {
		w := e.row(m, "outbound")
		if w.status != pipeline.WorkPending || w.attempts != 0 || w.seq <= q.seq {
			t.Fatalf("message %d row = %+v, want pending, reset, behind seq %d", m, w, q.seq)
		}
		if w.seq <= prev {
			t.Fatalf("replayed rows lost their relative order: seq %d after %d", w.seq, prev)
		}
		prev = w.seq
		if got := e.status(m); got != pipeline.StatusRouted {
			t.Fatalf("message %d is %s, want routed", m, got)
		}
		if n := e.events(m, pipeline.EventReplayed); n != 1 {
			t.Fatalf("message %d has %d replayed events", m, n)
		}
	}
	for _, m := range archDead {
		if got := e.row(m, "outbound").status; got != pipeline.WorkDead {
			t.Fatalf("archive row of %d is %s, want still dead", m, got)
		}
	}

	// Channel filter.
	res, err = ops.ReplayDead(e.ctx, e.db.Pool, pipeline.DeadFilter{Channel: "orm"}, ops.BulkOptions{})
	if err != nil || res.Matched != 0 {
		t.Fatalf("replay-dead --channel orm = %+v, %v; want nothing left", res, err)
	}
}

// Status counts what an operator expects per channel and per destination.
func TestStatusCounts(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.receive("adt")                            // queued for routing
	done := e.toOutbound("adt", lab)            // delivered
	dead := e.toOutbound("adt", lab)            // dead
	head := e.toOutbound("orm", lab)            // queued, head of lab: in flight
	e.toOutbound("orm", lab)                    // queued behind
	canc := e.toOutbound("orm", "outbound:x#1") // cancelled
	e.deliver(lab, done)
	e.fail(lab, dead, true, 0)
	e.cancel(pipeline.CancelFilter{Destination: "x"}, ops.BulkOptions{})
	e.runDrainer(lab)
	_ = head
	_ = canc

	st, err := ops.Status(e.ctx, e.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Channels) != 2 || st.Channels[0].Channel != "adt" || st.Channels[1].Channel != "orm" {
		t.Fatalf("channels = %+v", st.Channels)
	}
	adt, orm := st.Channels[0], st.Channels[1]
	if adt.Received != 3 || adt.ByStatus["received"] != 1 || adt.ByStatus["processed"] != 1 || adt.ByStatus["error"] != 1 {
		t.Fatalf("adt = %+v", adt)
	}
	if adt.Queued != 1 || adt.OldestQueuedSeconds == nil {
		t.Fatalf("adt queued = %d (oldest %v), want 1 ingress row", adt.Queued, adt.OldestQueuedSeconds)
	}
	if orm.Received != 3 || orm.ByStatus["routed"] != 2 || orm.ByStatus["processed"] != 1 || orm.Queued != 0 || orm.OldestQueuedSeconds != nil {
		t.Fatalf("orm = %+v", orm)
	}
	if len(st.Destinations) != 2 {
		t.Fatalf("destinations = %+v", st.Destinations)
	}
	l, x := st.Destinations[0], st.Destinations[1]
	if l.Destination != "lab" || l.Lanes != 1 || l.Queued != 2 || l.InFlight != 1 || l.Delivered != 1 || l.Dead != 1 || l.Cancelled != 0 || l.OldestQueuedSeconds == nil {
		t.Fatalf("lab = %+v", l)
	}
	if x.Destination != "x" || x.Lanes != 1 || x.Queued != 0 || x.Cancelled != 1 || x.InFlight != 0 || x.OldestQueuedSeconds != nil {
		t.Fatalf("x = %+v", x)
	}
}

// A head waiting out its backoff is not in flight even while its drainer's
// job is marked running.
func TestStatusWaitingHeadIsNotInFlight(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.toOutbound("adt", lab)
	e.fail(lab, m, false, time.Hour)
	e.runDrainer(lab)
	st, err := ops.Status(e.ctx, e.db.Pool)
	if err != nil {
		t.Fatal(err)
	}
	if d := st.Destinations[0]; d.Queued != 1 || d.InFlight != 0 {
		t.Fatalf("lab = %+v, want 1 queued, 0 in flight", d)
	}
}

// messages show returns the rows, replies and timeline, and the body only
// when asked.
func TestShowMessage(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	m := e.toOutbound("adt", lab)
	e.deliver(lab, m)

	v, err := ops.ShowMessage(e.ctx, e.db.Pool, nil, m, false)
	if err != nil {
		t.Fatal(err)
	}
	if v.Message.Raw != nil || len(v.Replies) != 1 || v.Replies[0].Body != nil {
		t.Fatalf("show without body returned a body (message %d bytes, reply %d bytes)", len(v.Message.Raw), len(v.Replies[0].Body))
	}
	if v.Message.Status != pipeline.StatusProcessed || v.Message.ControlID == "" || v.Message.Type() != "ADT^A01" {
		t.Fatalf("header = %+v", v.Message)
	}
	var stages []string
	for _, w := range v.Work {
		stages = append(stages, w.Stage+"/"+w.Status)
	}
	if want := []string{"ingress/done", "routed/done", "outbound/done"}; !slices.Equal(stages, want) {
		t.Fatalf("stage rows = %v, want %v", stages, want)
	}
	if r := v.Replies[0]; r.AckCode != "AA" || r.Attempt != 1 || r.Destination != "lab" {
		t.Fatalf("reply = %+v", r)
	}
	var evs []string
	for _, ev := range v.Events {
		evs = append(evs, ev.Event)
	}
	if want := []string{"received", "routed", "transformed", "delivered"}; !slices.Equal(evs, want) {
		t.Fatalf("events = %v, want %v", evs, want)
	}

	v, err = ops.ShowMessage(e.ctx, e.db.Pool, nil, m, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Message.Raw) == 0 || string(v.Replies[0].Body) != "MSH|ack" {
		t.Fatalf("show --body: message %d bytes, reply %q", len(v.Message.Raw), v.Replies[0].Body)
	}
	if _, err := ops.ShowMessage(e.ctx, e.db.Pool, nil, 424242, false); !errors.Is(err, pipeline.ErrNotFound) {
		t.Fatalf("show unknown: %v, want ErrNotFound", err)
	}
}
