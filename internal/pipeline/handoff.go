package pipeline

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/jobs"
)

// RoutedOut is one handler invocation the router chose for a message.
type RoutedOut struct {
	Route   string
	Handler string
}

// RouteHandoff hands one ingress row off without a fence, for operator
// tools and tests; drainers use RouteBatch with their execution.
func RouteHandoff(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, row Row, outs []RoutedOut) error {
	return RouteBatch(ctx, tx, ins, NoFence, []Row{row}, []RouteDecision{{Outs: outs}})
}

// OutboundOut is one delivery a handler produced.
type OutboundOut struct {
	Destination string
	Lane        string
	Payload     []byte
}

// TransformHandoff hands one routed row off without a fence, for operator
// tools and tests; drainers use TransformBatch with their execution.
func TransformHandoff(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, row Row, outs []OutboundOut) error {
	return TransformBatch(ctx, tx, ins, NoFence, []Row{row}, []TransformDecision{{Outs: outs}})
}

// DeadLetter ends a row as dead with a reason (never message content) and
// finalizes its message, in ex's fenced batch: a row whose destination or
// handler is not in the cluster's config.
func DeadLetter(ctx context.Context, tx pgx.Tx, ex Execution, row Row, reason string) error {
	h := newHandoff(ex)
	h.deadLetter([]Row{row}, []string{reason})
	return h.run(ctx, tx, nil, nil)
}

// RouteDecision is what the router chose for one ingress row: the routes
// that matched (none: unrouted), or a reason to dead-letter it.
type RouteDecision struct {
	Outs       []RoutedOut
	DeadReason string
}

// TransformDecision is what a handler produced for one routed row: the
// deliveries (none: filtered), or a reason to dead-letter the row.
type TransformDecision struct {
	Outs       []OutboundOut
	DeadReason string
	// State is what the row's transform read and wrote of transform state
	// (nil: nothing). The writes of a row that is dead-lettered are not
	// applied; its reads are still checked. See state.go.
	State *state.Change
}

// RouteBatch hands a batch of ingress rows of one channel off: consumes them,
// writes one routed row per matched route (in row order, so the routed lane
// keeps the ingress order), sets routed/unrouted, records the events and
// activates the routed lane. Everything it produces is tied, in one
// statement, to the rows it actually consumed: a row someone else ended
// after the drainer read it (dead-lettered by an operator or an orphan
// sweep) yields nothing.
func RouteBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ex Execution, rows []Row, decisions []RouteDecision) error {
	return RunHandoffs(ctx, tx, ins, PrepareRoute(ex, rows, decisions))
}

// TransformBatch hands a batch of routed rows off: consumes them, writes one
// outbound row per delivery (in row order), records the events, finalizes
// the messages it filtered or dead-lettered (the others have deliveries
// pending) and activates every destination lane written. As in
// RouteBatch, the outbound rows and events are produced in the statement
// that consumes, only for the rows it consumed.
func TransformBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ex Execution, rows []Row, decisions []TransformDecision) error {
	return RunHandoffs(ctx, tx, ins, PrepareTransform(ex, rows, decisions))
}

// Handoff is one drainer's route or transform hand-off of a batch of its
// lane's rows, prepared but not yet sent. RunHandoffs sends one, or the
// hand-offs of several drainers (of any lanes and of both stages) in one
// transaction: each statement of the hand-off then carries every
// participant's rows, so k lanes handing off together cost one fence, one
// consume-and-produce statement per stage, one finalizer and one activation
// check instead of k of each. On a host whose database is short of CPU,
// that fixed cost per statement (executor start, the plan's locks, the
// status-count triggers) is most of a one-row hand-off.
type Handoff struct {
	ex Execution
	// lanes are the lanes it writes into: locked before its writes,
	// activated after them.
	lanes []string
	// rows dead-lettered, with their sealed reasons
	dead        []int64
	deadReasons []string
	finalize    []int64
	route       routeArgs
	transform   transformArgs
	// stateful is set when a transform row read or wrote transform state:
	// its state statements and checks need the rows and decisions, and it
	// runs alone (Shareable).
	stateful  bool
	rows      []Row
	decisions []TransformDecision
	// rec is a delivery record's outcomes (PrepareRecord); replyIns
	// activates the reply channels' lanes it writes into.
	rec      *recordArgs
	replyIns jobs.Inserter
}

// routeArgs are the route statement's arrays: the consumed rows with the
// status each message gets, the events, and the routed rows to insert.
type routeArgs struct {
	cWork, cMsg      []int64
	cStatus          []string
	evWork           []int64
	evName, evDetail []string
	rWork            []int64
	rRoute, rHandler []string
	rLane, rChannel  []string
}

// transformArgs are the transform statement's arrays: the consumed rows,
// the events and the outbound rows to insert.
type transformArgs struct {
	consumed             []int64
	evWork               []int64
	evName, evDetail     []string
	oWork                []int64
	oLane, oChan, oRoute []string
	oHandler, oDest      []string
	oPayload             [][]byte
}

// Shareable reports whether h may share a transaction with other drainers'
// hand-offs. A hand-off with transform state runs alone: its key locks
// come after its consume, so two such hand-offs in one transaction could
// take keys in an order another transaction reverses. So does a record
// with a failed attempt or a routed reply: a shared transaction that fails
// is committed again hand-off by hand-off, which is harmless only for what
// can be applied twice, and a failed attempt counts again if the shared
// commit's fate was unknown (a lost connection after COMMIT).
func (h *Handoff) Shareable() bool {
	return !h.stateful && (h.rec == nil || (len(h.rec.failed) == 0 && len(h.rec.replies) == 0))
}

// Rows is the number of rows h hands off.
func (h *Handoff) Rows() int {
	n := len(h.dead) + len(h.route.cWork) + len(h.transform.consumed)
	if h.rec != nil {
		n += len(h.rec.ids)
	}
	return n
}

// PrepareRoute prepares RouteBatch's hand-off of rows.
func PrepareRoute(ex Execution, rows []Row, decisions []RouteDecision) *Handoff {
	h := &Handoff{ex: ex}
	a := &h.route
	for i, row := range rows {
		d := decisions[i]
		if d.DeadReason != "" {
			h.deadLetter(row, d.DeadReason)
			continue
		}
		a.cWork, a.cMsg = append(a.cWork, row.ID), append(a.cMsg, row.MessageID)
		if len(d.Outs) == 0 {
			a.cStatus = append(a.cStatus, StatusUnrouted)
			a.evWork = append(a.evWork, row.ID)
			a.evName, a.evDetail = append(a.evName, EventUnrouted), append(a.evDetail, "no route matched")
			continue
		}
		a.cStatus = append(a.cStatus, StatusRouted)
		lane := jobs.RoutedLane(row.Channel)
		detail := ""
		for j, o := range d.Outs {
			a.rWork = append(a.rWork, row.ID)
			a.rRoute, a.rHandler = append(a.rRoute, o.Route), append(a.rHandler, o.Handler)
			a.rLane, a.rChannel = append(a.rLane, lane), append(a.rChannel, row.Channel)
			if j > 0 {
				detail += ", "
			}
			detail += o.Route
		}
		if len(h.lanes) == 0 || h.lanes[len(h.lanes)-1] != lane {
			h.lanes = append(h.lanes, lane)
		}
		a.evWork = append(a.evWork, row.ID)
		a.evName, a.evDetail = append(a.evName, EventRouted), append(a.evDetail, detail)
	}
	return h
}

// PrepareTransform prepares TransformBatch's hand-off of rows.
func PrepareTransform(ex Execution, rows []Row, decisions []TransformDecision) *Handoff {
	h := &Handoff{ex: ex}
	a := &h.transform
	for i, row := range rows {
		d := decisions[i]
		if !d.State.Empty() {
			h.stateful = true
		}
		if d.DeadReason != "" {
			h.deadLetter(row, d.DeadReason)
			continue
		}
		a.consumed = append(a.consumed, row.ID)
		if len(d.Outs) == 0 {
			// Only a filtered row can end its message here: one that
			// produced deliveries leaves them pending in this same
			// transaction, so finalizing it would change nothing and
			// cost a lock and a statement per hand-off.
			h.finalize = append(h.finalize, row.MessageID)
		}
		for _, o := range d.Outs {
			a.oWork = append(a.oWork, row.ID)
			a.oLane, a.oChan, a.oRoute = append(a.oLane, o.Lane), append(a.oChan, row.Channel), append(a.oRoute, row.Route)
			a.oHandler, a.oDest = append(a.oHandler, row.Handler), append(a.oDest, o.Destination)
			a.oPayload = append(a.oPayload, ex.Keys.Seal(ColPayload, MessageRow(row.MessageID), o.Payload))
			h.lanes = append(h.lanes, o.Lane)
		}
		ev := EventTransformed
		if len(d.Outs) == 0 {
			ev = EventFiltered
		}
		a.evWork, a.evName, a.evDetail = append(a.evWork, row.ID), append(a.evName, ev), append(a.evDetail, row.Handler)
	}
	if h.stateful {
		h.rows, h.decisions = rows, decisions
	}
	return h
}

// deadLetter adds row to h's dead letters, with its reason sealed.
func (h *Handoff) deadLetter(row Row, reason string) {
	h.dead = append(h.dead, row.ID)
	h.deadReasons = append(h.deadReasons, h.ex.Keys.SealString(ColError, MessageRow(row.MessageID), reason))
	h.finalize = append(h.finalize, row.MessageID)
}

// RunHandoffs sends hs in tx as one batch, in the order every writer takes
// its locks: the drainers' river_job rows (every execution's fence, by job
// id), the lanes written (sorted), the rows consumed, the messages
// finalized (by id). It returns ErrSuperseded when any execution is no
// longer the running one; the caller must then roll tx back, since the
// others' writes went with it. A hand-off that is not Shareable must be
// alone. A caller sharing tx between drainers begins it with a lock
// timeout (PipelineTxTimeouts), so that a lock held elsewhere
// fails it rather than holding them all.
func RunHandoffs(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, hs ...*Handoff) error {
	if len(hs) > 1 {
		for _, h := range hs {
			if !h.Shareable() {
				return errors.New("a hand-off that is not shareable (transform state, a failed attempt or a routed reply) cannot share its transaction")
			}
		}
	}
	if len(hs) == 1 && hs[0].rec != nil && len(hs[0].rec.replies) > 0 && hs[0].ex.Keys.Enabled() {
		// A reply routed back in is a message whose sealed body is bound
		// to its id: drawn first (a reply is recorded alone, and rare).
		reps := hs[0].rec.replies
		ids, err := DrawMessageIDs(ctx, tx, len(reps))
		if err != nil {
			return err
		}
		for i := range reps {
			reps[i].id = ids[i]
		}
	}
	var b *handoff
	if len(hs) == 1 {
		b = newHandoff(hs[0].ex) // its fence, as every hand-off alone
	} else {
		b = newSharedHandoff(hs)
	}
	var (
		lanes, deadReasons []string
		dead               []int64
		r                  routeArgs
		t                  transformArgs
		recs               []*recordArgs
	)
	for _, h := range hs {
		if h.rec != nil {
			recs = append(recs, h.rec)
		}
		if ins == nil {
			ins = h.replyIns
		}
		lanes = append(lanes, h.lanes...)
		dead, deadReasons = append(dead, h.dead...), append(deadReasons, h.deadReasons...)
		b.finalize = append(b.finalize, h.finalize...)
		r.append(&h.route)
		t.append(&h.transform)
	}
	// Lanes before rows and message locks: the order every writer follows.
	jobs.QueueLocks(&b.b, lanes)
	if len(dead) > 0 {
		QueueDeadLetter(&b.b, dead, deadReasons)
	}
	if len(r.cWork) > 0 {
		queueRoute(&b.b, &r)
	}
	if len(t.consumed) > 0 {
		queueTransform(&b.b, &t)
	}
	if len(hs) == 1 && hs[0].stateful {
		// After the lane locks and the consume, before the message locks.
		queueState(b, hs[0].rows, hs[0].decisions)
	}
	if len(recs) > 0 {
		queueRecords(b, recs)
	}
	var act *jobs.Activation
	if len(lanes) > 0 {
		act = jobs.QueueActivation(&b.b, lanes)
	}
	return b.run(ctx, tx, ins, act)
}

// newSharedHandoff starts the batch of several hand-offs with one fence
// statement for all their executions, which locks their job rows in id
// order; b.fenced is set only once it found every one running.
func newSharedHandoff(hs []*Handoff) *handoff {
	b := &handoff{fenced: true}
	var ids []int64
	var at []time.Time
	for _, h := range hs {
		if !h.ex.unfenced() {
			ids, at = append(ids, h.ex.JobID), append(at, h.ex.AttemptedAt)
		}
	}
	if len(ids) == 0 {
		return b
	}
	b.fenced = false
	b.b.Queue(jobs.FenceManySQL, ids, at).Query(func(rows pgx.Rows) error {
		n := 0
		for rows.Next() {
			n++
		}
		b.fenced = n == len(ids)
		return rows.Err()
	})
	return b
}

func (a *routeArgs) append(o *routeArgs) {
	a.cWork, a.cMsg, a.cStatus = append(a.cWork, o.cWork...), append(a.cMsg, o.cMsg...), append(a.cStatus, o.cStatus...)
	a.evWork, a.evName, a.evDetail = append(a.evWork, o.evWork...), append(a.evName, o.evName...), append(a.evDetail, o.evDetail...)
	a.rWork, a.rRoute, a.rHandler = append(a.rWork, o.rWork...), append(a.rRoute, o.rRoute...), append(a.rHandler, o.rHandler...)
	a.rLane, a.rChannel = append(a.rLane, o.rLane...), append(a.rChannel, o.rChannel...)
}

func (a *transformArgs) append(o *transformArgs) {
	a.consumed = append(a.consumed, o.consumed...)
	a.evWork, a.evName, a.evDetail = append(a.evWork, o.evWork...), append(a.evName, o.evName...), append(a.evDetail, o.evDetail...)
	a.oWork, a.oLane, a.oChan = append(a.oWork, o.oWork...), append(a.oLane, o.oLane...), append(a.oChan, o.oChan...)
	a.oRoute, a.oHandler, a.oDest = append(a.oRoute, o.oRoute...), append(a.oHandler, o.oHandler...), append(a.oDest, o.oDest...)
	a.oPayload = append(a.oPayload, o.oPayload...)
}

// queueRoute queues the route statement: consume the ingress rows, set
// their messages' status, record the events and insert the routed rows,
// each produced only for a row consumed here. Routed rows are inserted in
// the order given, which is each lane's ingress order.
func queueRoute(b *pgx.Batch, a *routeArgs) {
	b.Queue(`
		WITH u AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(work, msg, status)),
		consumed AS (
			UPDATE mefor_work w SET status = 'done', updated_at = clock_timestamp(), finished_at = clock_timestamp()
			FROM u WHERE w.id = u.work AND w.status = `+PendingByID+`
			RETURNING w.id, w.message_id
		), st AS (
			UPDATE mefor_message m SET status = u.status, updated_at = clock_timestamp()
			FROM u JOIN consumed c ON c.id = u.work
			WHERE m.id = u.msg
		), ev AS (
			INSERT INTO mefor_event (message_id, event, work_id, detail)
			SELECT c.message_id, e.name, e.work, NULLIF(e.detail, '')
			FROM unnest($4::bigint[], $5::text[], $6::text[]) WITH ORDINALITY AS e(work, name, detail, n)
			JOIN consumed c ON c.id = e.work
			ORDER BY e.n
		)
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler)
		SELECT c.message_id, 'routed', r.lane, r.channel, r.route, r.handler
		FROM unnest($7::bigint[], $8::text[], $9::text[], $10::text[], $11::text[]) WITH ORDINALITY AS r(work, route, handler, lane, channel, n)
		JOIN consumed c ON c.id = r.work
		ORDER BY r.n`,
		a.cWork, a.cMsg, a.cStatus, a.evWork, a.evName, a.evDetail, a.rWork, a.rRoute, a.rHandler, a.rLane, a.rChannel)
}

// queueTransform queues the transform statement: consume the routed rows,
// record the events and insert the outbound rows, in the order given, each
// produced only for a row consumed here.
func queueTransform(b *pgx.Batch, a *transformArgs) {
	b.Queue(`
		WITH consumed AS (
			UPDATE mefor_work SET status = 'done', updated_at = clock_timestamp(), finished_at = clock_timestamp()
			WHERE id = ANY($1::bigint[]) AND status = `+PendingByID+`
			RETURNING id, message_id
		), ev AS (
			INSERT INTO mefor_event (message_id, event, work_id, detail)
			SELECT c.message_id, e.name, e.work, NULLIF(e.detail, '')
			FROM unnest($2::bigint[], $3::text[], $4::text[]) WITH ORDINALITY AS e(work, name, detail, n)
			JOIN consumed c ON c.id = e.work
			ORDER BY e.n
		)
		INSERT INTO mefor_work (message_id, stage, lane, channel, route, handler, destination, payload)
		SELECT c.message_id, 'outbound', o.lane, o.channel, o.route, o.handler, o.destination, o.payload
		FROM unnest($5::bigint[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::bytea[])
			WITH ORDINALITY AS o(work, lane, channel, route, handler, destination, payload, n)
		JOIN consumed c ON c.id = o.work
		ORDER BY o.n`,
		a.consumed, a.evWork, a.evName, a.evDetail, a.oWork, a.oLane, a.oChan, a.oRoute, a.oHandler, a.oDest, a.oPayload)
}
