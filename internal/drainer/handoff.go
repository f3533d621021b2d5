package drainer

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/state"
	"github.com/mefor/mefor/internal/store"
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

// RouteBatch hands a batch of ingress rows of one channel off: consumes them,
// writes one routed row per matched route (in row order, so the routed lane
// keeps the ingress order), sets routed/unrouted, records the events and
// activates the routed lane. Everything it produces is tied, in one
// statement, to the rows it actually consumed: a row someone else ended
// after the drainer read it (dead-lettered by an operator or an orphan
// sweep) yields nothing.
func RouteBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ex Execution, rows []Row, decisions []RouteDecision) error {
	h := newHandoff(ex)
	var (
		dead        []Row
		deadReasons []string
		// consumed rows, each with the status its message gets
		cWork, cMsg []int64
		cStatus     []string
		// routed rows to insert, by the row they come from
		rWork               []int64
		rRoute, rHandler    []string
		evWork              []int64
		evName, evDetail    []string
		channel, routedLane string
	)
	for i, row := range rows {
		d := decisions[i]
		if d.DeadReason != "" {
			dead = append(dead, row)
			deadReasons = append(deadReasons, d.DeadReason)
			continue
		}
		channel = row.Channel
		cWork, cMsg = append(cWork, row.ID), append(cMsg, row.MessageID)
		if len(d.Outs) == 0 {
			cStatus = append(cStatus, store.StatusUnrouted)
			evWork = append(evWork, row.ID)
			evName, evDetail = append(evName, store.EventUnrouted), append(evDetail, "no route matched")
			continue
		}
		cStatus = append(cStatus, store.StatusRouted)
		detail := ""
		for j, o := range d.Outs {
			rWork = append(rWork, row.ID)
			rRoute, rHandler = append(rRoute, o.Route), append(rHandler, o.Handler)
			if j > 0 {
				detail += ", "
			}
			detail += o.Route
		}
		evWork = append(evWork, row.ID)
		evName, evDetail = append(evName, store.EventRouted), append(evDetail, detail)
	}

	var act *jobs.Activation
	if len(rWork) > 0 {
		routedLane = jobs.RoutedLane(channel)
		jobs.QueueLocks(&h.b, []string{routedLane})
	}
	h.deadLetter(dead, deadReasons)
	if len(cWork) > 0 {
		h.b.Queue(`
			WITH u AS (SELECT * FROM unnest($1::bigint[], $2::bigint[], $3::text[]) AS u(work, msg, status)),
			consumed AS (
				UPDATE mefor_work w SET status = 'done', updated_at = clock_timestamp(), finished_at = clock_timestamp()
				FROM u WHERE w.id = u.work AND w.status = `+store.PendingByID+`
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
			SELECT c.message_id, 'routed', $10, $11, r.route, r.handler
			FROM unnest($7::bigint[], $8::text[], $9::text[]) WITH ORDINALITY AS r(work, route, handler, n)
			JOIN consumed c ON c.id = r.work
			ORDER BY r.n`,
			cWork, cMsg, cStatus, evWork, evName, evDetail, rWork, rRoute, rHandler, routedLane, channel)
	}
	if len(rWork) > 0 {
		act = jobs.QueueActivation(&h.b, []string{routedLane})
	}
	return h.run(ctx, tx, ins, act)
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

// TransformBatch hands a batch of routed rows off: consumes them, writes one
// outbound row per delivery (in row order), records the events, finalizes
// the messages it filtered or dead-lettered (the others have deliveries
// pending) and activates every destination lane written. As in
// RouteBatch, the outbound rows and events are produced in the statement
// that consumes, only for the rows it consumed.
func TransformBatch(ctx context.Context, tx pgx.Tx, ins jobs.Inserter, ex Execution, rows []Row, decisions []TransformDecision) error {
	h := newHandoff(ex)
	var (
		dead                 []Row
		deadReasons          []string
		consumed             []int64
		oWork                []int64
		oLane, oChan, oRoute []string
		oHandler, oDest      []string
		oPayload             [][]byte
		evWork               []int64
		evName, evDetail     []string
		lanes                []string
	)
	for i, row := range rows {
		d := decisions[i]
		if d.DeadReason != "" {
			dead = append(dead, row)
			deadReasons = append(deadReasons, d.DeadReason)
			continue
		}
		consumed = append(consumed, row.ID)
		if len(d.Outs) == 0 {
			// Only a filtered row can end its message here: one that
			// produced deliveries leaves them pending in this same
			// transaction, so finalizing it would change nothing and
			// cost a lock and a statement per hand-off.
			h.finalize = append(h.finalize, row.MessageID)
		}
		for _, o := range d.Outs {
			oWork = append(oWork, row.ID)
			oLane, oChan, oRoute = append(oLane, o.Lane), append(oChan, row.Channel), append(oRoute, row.Route)
			oHandler, oDest = append(oHandler, row.Handler), append(oDest, o.Destination)
			oPayload = append(oPayload, h.keys.Seal(store.ColPayload, o.Payload))
			lanes = append(lanes, o.Lane)
		}
		ev := store.EventTransformed
		if len(d.Outs) == 0 {
			ev = store.EventFiltered
		}
		evWork, evName, evDetail = append(evWork, row.ID), append(evName, ev), append(evDetail, row.Handler)
	}

	// Lanes before message locks: the order every writer follows.
	jobs.QueueLocks(&h.b, lanes)
	h.deadLetter(dead, deadReasons)
	var act *jobs.Activation
	if len(consumed) > 0 {
		h.b.Queue(`
			WITH consumed AS (
				UPDATE mefor_work SET status = 'done', updated_at = clock_timestamp(), finished_at = clock_timestamp()
				WHERE id = ANY($1::bigint[]) AND status = `+store.PendingByID+`
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
			consumed, evWork, evName, evDetail, oWork, oLane, oChan, oRoute, oHandler, oDest, oPayload)
	}
	// After the lane locks and the consume, before the message locks.
	queueState(h, rows, decisions)
	if len(oWork) > 0 {
		act = jobs.QueueActivation(&h.b, lanes)
	}
	return h.run(ctx, tx, ins, act)
}
