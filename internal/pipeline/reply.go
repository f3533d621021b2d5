package pipeline

import (
	"github.com/mefor/mefor/jobs"
)

// EventReplied, on a delivered message's timeline, says what became of the
// partner's reply when its destination has reply_to: the message it was
// stored as, or why it was not routed.
const EventReplied = "replied"

// SourceReply is the source of a message stored from a partner's reply.
const SourceReply = "reply"

// ReplyRoute routes a partner's reply into a channel, in the transaction
// that records the delivery it answers (Attempt.ReplyTo): the reply becomes
// a message of Channel, linked to the delivered message (its parent, one
// reply deeper), with its ingress row and lane activation, as intake stores
// a message. A reply deeper than MaxDepth is stored with status error and
// the reason, and gets no ingress row: a loop of replies stops there.
type ReplyRoute struct {
	Channel  string
	MaxDepth int
	// Ins activates the channel's ingress lane when it has no live drainer.
	Ins jobs.Inserter
	// NotHL7, when set, is why the reply is not a message (never its
	// content): only an event on the delivered message says so.
	NotHL7 string
	// The reply's header, when it parsed.
	ControlID, MessageType, TriggerEvent, SendingApp, SendingFacility string
}

// replyLanes are the reply channels' ingress lanes of routes, for the
// record to lock with the lanes of its batch (before the deliveries' work
// rows are written: lane locks before work rows, the order every writer
// follows) and to activate.
func replyLanes(routes []*ReplyRoute) []string {
	var lanes []string
	for _, rt := range routes {
		if rt.NotHL7 == "" {
			lanes = append(lanes, jobs.IngressLane(rt.Channel))
		}
	}
	return lanes
}

// nullID is id as an argument, NULL for 0.
func nullID(id int64) *int64 {
	if id == 0 {
		return nil
	}
	return &id
}

// queueReply queues the reply's message, events and ingress row, after the
// statement that records row delivered. Everything is tied, in the
// statement, to the delivery this transaction recorded: the row must be done, with a delivered response at
// its current attempt that no reply message links to yet, so a record that
// found the row no longer pending produces nothing, and none is produced
// twice.
func queueReply(h *handoff, row Row, a Attempt, reply []byte, id int64) {
	rt := a.ReplyTo
	const delivery = `
		WITH w AS (
			SELECT w.id, w.message_id, r.id AS response_id
			FROM mefor_work w
			JOIN mefor_response r ON r.work_id = w.id AND r.attempt = w.attempts AND r.outcome = 'delivered'
			WHERE w.id = $1 AND w.status = 'done'
			  AND NOT EXISTS (SELECT 1 FROM mefor_message c WHERE c.parent_id = w.message_id AND c.parent_response_id = r.id)
			ORDER BY r.id DESC LIMIT 1
		)`
	if rt.NotHL7 != "" {
		h.b.Queue(delivery+`
			INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
			SELECT message_id, $4, id, $2, format('reply of %s bytes not routed to channel %s: %s', $3::int, $5::text, $6::text) FROM w`,
			row.ID, row.Destination, len(reply), EventReplied, rt.Channel, h.keys.SealString(ColError, MessageRow(row.MessageID), rt.NotHL7))
		return
	}
	lane := jobs.IngressLane(rt.Channel)
	h.b.Queue(delivery+`, p AS (
			SELECT w.message_id AS id, w.response_id, m.reply_depth + 1 AS depth, m.reply_depth + 1 > $5 AS over
			FROM w JOIN mefor_message m ON m.id = w.message_id
		), m AS (
			INSERT INTO mefor_message (id, channel, source, control_id, message_type, trigger_event, sending_app,
				sending_facility, size, raw, status, error, parent_id, parent_response_id, reply_depth) OVERRIDING SYSTEM VALUE
			SELECT coalesce($15::bigint, nextval(pg_get_serial_sequence('mefor_message', 'id')::regclass)), $3, $7, NULLIF($8, ''), NULLIF($9, ''), NULLIF($10, ''), NULLIF($11, ''), NULLIF($12, ''),
				$14::int, $6::bytea,
				CASE WHEN p.over THEN 'error' ELSE 'received' END,
				CASE WHEN p.over THEN format('reply %s deep, past reply_depth_limit %s of destination %s: recorded, not routed (a loop of replies?)',
					p.depth, $5::int, $2::text) END,
				p.id, p.response_id, p.depth
			FROM p
			RETURNING id, parent_id, status, error
		), e AS (
			INSERT INTO mefor_event (message_id, event, detail)
			SELECT m.id, v.event, v.detail
			FROM m CROSS JOIN LATERAL (VALUES
				(1, 'received', format('reply from destination %s to message %s', $2::text, m.parent_id)),
				(2, 'failed', m.error)
			) AS v(n, event, detail)
			WHERE v.n = 1 OR m.status = 'error'
			ORDER BY v.n
		), pe AS (
			INSERT INTO mefor_event (message_id, event, work_id, destination, detail)
			SELECT m.parent_id, $13, $1, $2,
				CASE WHEN m.status = 'error' THEN format('reply stored as message %s of channel %s, not routed: past reply_depth_limit %s', m.id, $3::text, $5::int)
				ELSE format('reply stored as message %s of channel %s', m.id, $3::text) END
			FROM m
		)
		INSERT INTO mefor_work (message_id, stage, lane, channel)
		SELECT id, 'ingress', $4, $3 FROM m WHERE status = 'received'`,
		row.ID, row.Destination, rt.Channel, lane, rt.MaxDepth, h.keys.Seal(ColRaw, MessageRow(id), reply), SourceReply,
		ColumnText(rt.ControlID), ColumnText(rt.MessageType), ColumnText(rt.TriggerEvent),
		ColumnText(rt.SendingApp), ColumnText(rt.SendingFacility), EventReplied, len(reply), nullID(id))
}
