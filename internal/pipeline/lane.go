package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/crypt"
	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/jobs"
)

// Row is one pending unit of stage work, as a drainer sees it.
type Row struct {
	ID          int64
	MessageID   int64
	Stage       string
	Lane        string
	Seq         int64
	Channel     string
	Route       string
	Handler     string
	Destination string
	Attempts    int
	// CancelRequested is set when an operator asked for the row to be
	// cancelled while the lane's drainer was running: the drainer must
	// cancel it instead of sending it.
	CancelRequested bool
	// Held is set on an outbound row while a lane of another layout
	// generation of its destination has a pending row with a lower seq
	// (see layout.go): the destination's ordering changed, and rows queued
	// under the old one go first.
	Held bool
	// DueIn is how long until the row may be attempted (zero when due), by
	// the database clock so that nodes with skewed clocks agree.
	DueIn time.Duration
	// Body is what the stage works on: the stored message for ingress and
	// routed rows, the transformed message for outbound rows. PendingRows
	// returns it as stored; OpenBodies opens it.
	Body []byte
	// BodyColumn is where Body was read from (the message's raw body or
	// the row's payload), which its seal is bound to.
	BodyColumn crypt.Column
	// ControlID and MessageType come from the message, for file names and logs.
	ControlID   string
	MessageType string
	ReceivedAt  time.Time
}

// Batcher sends batches of statements: a pool, a connection or a
// transaction.
type Batcher interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// PendingRows returns up to limit pending rows of a lane, head first. For
// an outbound lane the same statement reads the layout barrier (Held).
func PendingRows(ctx context.Context, q Batcher, lane string, limit int) ([]Row, error) {
	return PendingRowsAfter(ctx, q, lane, 0, limit)
}

// PendingRowsAfter is PendingRows without the rows up to seq after: those a
// delivery drainer has sent and not yet recorded (a record window), which
// are still pending in the table.
//
// Read outside a transaction, the read plans generically
// (QueueGenericPlans), in the same round trip; in a transaction, as
// the transaction does.
func PendingRowsAfter(ctx context.Context, q Batcher, lane string, after int64, limit int) ([]Row, error) {
	stage, _, _ := strings.Cut(lane, ":")
	b := &pgx.Batch{}
	if _, inTx := q.(pgx.Tx); !inTx {
		QueueGenericPlans(b)
	}
	if stage == jobs.StageOutbound {
		b.Queue(readOutboundSQL, lane, limit, after)
	} else {
		b.Queue(readLaneSQL, lane, limit, after)
	}
	br := q.SendBatch(ctx, b)
	defer br.Close()
	for range b.Len() - 1 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("read lane %s: %w", lane, err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Row, error) { return scanRow(r) })
	if err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("read lane %s: %w", lane, err)
	}
	return out, nil
}

// LaneRead asks for up to Limit pending rows of Lane after seq After, as
// PendingRowsAfter does.
type LaneRead struct {
	Lane  string
	After int64
	Limit int
}

// PendingRowsOfLanes answers several lanes' reads in one round trip: one
// statement for the route and transform lanes among them and one for the
// delivery lanes, each reading every lane of its kind as PendingRowsAfter
// reads one (head first, at most its limit, the layout barrier for a
// delivery lane). out[i] answers reads[i]. It is for drainers of several
// lanes that read at the same moment; a single read is PendingRowsAfter.
// Read outside a transaction, as PendingRowsAfter is.
func PendingRowsOfLanes(ctx context.Context, q Batcher, reads []LaneRead) ([][]Row, error) {
	if len(reads) == 1 {
		rows, err := PendingRowsAfter(ctx, q, reads[0].Lane, reads[0].After, reads[0].Limit)
		return [][]Row{rows}, err
	}
	b := &pgx.Batch{}
	if _, inTx := q.(pgx.Tx); !inTx {
		QueueGenericPlans(b)
	}
	skip := b.Len()
	var kinds [][]int // indexes into reads, per statement queued
	for _, outbound := range []bool{false, true} {
		var idx []int
		var lanes []string
		var afters []int64
		var limits []int32
		for i, r := range reads {
			if stage, _, _ := strings.Cut(r.Lane, ":"); (stage == jobs.StageOutbound) == outbound {
				idx = append(idx, i)
				lanes, afters, limits = append(lanes, r.Lane), append(afters, r.After), append(limits, int32(r.Limit))
			}
		}
		if len(idx) == 0 {
			continue
		}
		sql := readLanesSQL
		if outbound {
			sql = readOutboundLanesSQL
		}
		b.Queue(sql, lanes, afters, limits)
		kinds = append(kinds, idx)
	}
	out := make([][]Row, len(reads))
	br := q.SendBatch(ctx, b)
	defer br.Close()
	for range skip {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("read %d lanes: %w", len(reads), err)
		}
	}
	for _, idx := range kinds {
		rows, err := br.Query()
		if err != nil {
			return nil, fmt.Errorf("read %d lanes: %w", len(reads), err)
		}
		for rows.Next() {
			var k int64 // which of idx's reads the row answers, from 1
			w, err := scanRow(rows, &k)
			if err != nil {
				rows.Close()
				return nil, fmt.Errorf("read %d lanes: %w", len(reads), err)
			}
			if k < 1 || int(k) > len(idx) {
				rows.Close()
				return nil, fmt.Errorf("read %d lanes: a row answered read %d of %d", len(reads), k, len(idx))
			}
			i := idx[k-1]
			if w.Lane != reads[i].Lane {
				// Never hand a drainer another lane's row: its order and its
				// fence are its own lane's.
				rows.Close()
				return nil, fmt.Errorf("read %d lanes: a row of lane %s answered the read of %s", len(reads), w.Lane, reads[i].Lane)
			}
			out[i] = append(out[i], w)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("read %d lanes: %w", len(reads), err)
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("read %d lanes: %w", len(reads), err)
	}
	return out, nil
}

// scanRow scans one row of a lane read, in readSelectSQL's order, after
// the columns of prefix (those of a read of several lanes).
func scanRow(r pgx.Row, prefix ...any) (Row, error) {
	var w Row
	var dueIn float64
	var fromPayload bool
	err := r.Scan(append(prefix, &w.ID, &w.MessageID, &w.Stage, &w.Lane, &w.Seq, &w.Channel,
		&w.Route, &w.Handler, &w.Destination, &w.Attempts, &w.CancelRequested, &w.Held, &dueIn, &w.Body,
		&fromPayload, &w.ControlID, &w.MessageType, &w.ReceivedAt)...)
	w.DueIn = time.Duration(dueIn * float64(time.Second))
	w.BodyColumn = ColRaw
	if fromPayload {
		w.BodyColumn = ColPayload
	}
	return w, err
}

// readLaneSQL reads lane $1's pending rows after seq $3, head first, at
// most $2; readOutboundSQL also reads its layout barrier (Row.Held). An
// ingress or routed lane has no layout: its read is a statement of its own
// rather than one that computes the barrier and discards it (the planner
// cannot drop a join on a parameter from a generic plan, so the barrier
// was computed for every read, and planned into every plan, which were
// most of the read's cost).
const (
	readLaneSQL     = readSelectSQL + `false,` + readRestSQL + readWhereSQL
	readOutboundSQL = readSelectSQL + `w.seq > coalesce(b.seq, w.seq),` + readRestSQL + `
		LEFT JOIN (` + jobs.LayoutBarrierSQL + `) b ON true` + readWhereSQL
	readSelectSQL = `
		SELECT w.id, w.message_id, w.stage, w.lane, w.seq, w.channel,
			coalesce(w.route, ''), coalesce(w.handler, ''), coalesce(w.destination, ''),
			w.attempts, w.cancel_requested_at IS NOT NULL,
			`
	readRestSQL = `
			greatest(0, extract(epoch FROM w.next_attempt_at - clock_timestamp()))::float8,
			coalesce(w.payload, m.raw, ''::bytea), w.payload IS NOT NULL,
			coalesce(m.control_id, ''), coalesce(m.message_type, ''), m.received_at
		FROM mefor_work w JOIN mefor_message m ON m.id = w.message_id`
	readWhereSQL = `
		WHERE w.lane = $1 AND w.status = 'pending' AND w.seq > $3
		ORDER BY w.seq
		LIMIT $2`
)

// OpenBodies opens the bodies of rows read by PendingRows, in place. A body
// that does not open (its key is missing, it was altered, copied from
// another message, or is plaintext in a sealed store) fails the whole batch
// with an *UnopenedError naming the row and the key: nothing is ever
// handed on or sent from a value that did not open.
func OpenBodies(kr *crypt.Keyring, rows []Row) error {
	for i := range rows {
		body, err := kr.Open(rows[i].BodyColumn, MessageRow(rows[i].MessageID), rows[i].Body)
		if err != nil {
			return &UnopenedError{Row: rows[i], Err: err}
		}
		rows[i].Body = body
	}
	return nil
}

// UnopenedError is a row whose body did not open. crypt.IsTampered(err)
// tells a value that must never be used (dead-letter it:
// DeadLetterTampered) from one whose key is missing (hold the lane).
type UnopenedError struct {
	Row Row
	Err error
}

func (e *UnopenedError) Error() string {
	return fmt.Sprintf("row %d of message %d: %v", e.Row.ID, e.Row.MessageID, e.Err)
}

func (e *UnopenedError) Unwrap() error { return e.Err }

// TamperedPrefix starts the dead-letter reason of a tampered row.
const TamperedPrefix = "tampered: "

// TamperedReason is the dead-letter reason of a row whose body did not open
// as sealed for it: TamperedPrefix and the crypt error, which names the
// column and key, never content. It is stored in clear, as mefor's other
// reasons that quote nothing are, so alerts can count it in SQL.
func TamperedReason(err error) string { return TamperedPrefix + err.Error() }

// DeadLetterTampered dead-letters row, whose stored body is tampered
// (crypt.IsTampered), with reason TamperedReason(cause), and finalizes its
// message, in one transaction fenced by ex under the row's lane lock. The
// row is never handed on or sent; the lane moves on, as after any dead
// letter. It reports whether the row was still pending.
func DeadLetterTampered(ctx context.Context, pool *pgxpool.Pool, ex Execution, row Row, cause error) (bool, error) {
	var n int64
	err := pgx.BeginTxFunc(ctx, pool, PipelineTxTimeouts(dbpool.Intake), func(tx pgx.Tx) error {
		if err := Fence(ctx, tx, ex); err != nil {
			return err
		}
		if err := jobs.LockLanes(ctx, tx, []string{row.Lane}); err != nil {
			return err
		}
		b := &pgx.Batch{}
		QueueDeadLetter(b, []int64{row.ID}, []string{TamperedReason(cause)})
		QueueFinalize(b, []int64{row.MessageID})
		br := tx.SendBatch(ctx, b)
		tag, err := br.Exec()
		if err != nil {
			br.Close()
			return fmt.Errorf("dead-letter tampered row %d: %w", row.ID, err)
		}
		n = tag.RowsAffected()
		if err := br.Close(); err != nil {
			return fmt.Errorf("dead-letter tampered row %d: %w", row.ID, err)
		}
		return nil
	})
	return n > 0, err
}

// readLanesSQL reads several route or transform lanes, and
// readOutboundLanesSQL several delivery lanes, as readLaneSQL and
// readOutboundSQL read one: lane $1[i] after seq $2[i], at most $3[i]
// rows, each row led by i (from 1). Each lane is read by its own probe of
// its partial index, head first, and a delivery lane's barrier is computed
// once for the lane.
const (
	readLanesSQL = `
		SELECT r.i, rd.* FROM unnest($1::text[], $2::bigint[], $3::int[]) WITH ORDINALITY AS r(lane, after, lim, i)
		CROSS JOIN LATERAL (` + readSelectSQL + `false,` + readRestSQL + readEachWhereSQL + `) rd
		ORDER BY r.i, rd.seq`
	readEachWhereSQL = `
		WHERE w.lane = r.lane AND w.status = 'pending' AND w.seq > r.after
		ORDER BY w.seq
		LIMIT r.lim`
)

var readOutboundLanesSQL = `
		SELECT r.i, rd.* FROM unnest($1::text[], $2::bigint[], $3::int[]) WITH ORDINALITY AS r(lane, after, lim, i)
		LEFT JOIN LATERAL (` + eachLayoutBarrierSQL + `) b ON true
		CROSS JOIN LATERAL (` + readSelectSQL + `w.seq > coalesce(b.seq, w.seq),` + readRestSQL + readEachWhereSQL + `) rd
		ORDER BY r.i, rd.seq`

// eachLayoutBarrierSQL is jobs.LayoutBarrierSQL for the lane r.lane of a read of
// several lanes.
var eachLayoutBarrierSQL = strings.ReplaceAll(jobs.LayoutBarrierSQL, "$1", "r.lane")

// CompleteIfEmpty takes the lane's lock and reports whether the lane has no
// pending row. The caller completes its drainer job in the same tx when it
// does; a producer blocked on the lock then finds no live drainer and
// activates a new one.
func CompleteIfEmpty(ctx context.Context, tx pgx.Tx, lane string) (bool, error) {
	if err := jobs.LockLanes(ctx, tx, []string{lane}); err != nil {
		return false, err
	}
	pending, err := HasPending(ctx, tx, lane)
	return !pending, err
}

// HasPending reports whether lane has a pending row.
func HasPending(ctx context.Context, q DBTX, lane string) (bool, error) {
	// The head, not EXISTS: the planner drops an EXISTS's ORDER BY, and a
	// generic plan (PipelineTx) of the EXISTS expects any lane to be
	// long and scans the table for a first match, which for a short lane
	// beside a long one means reading the long one. Ordered by seq, only
	// the lane's partial index gives the head without a sort.
	var head int64
	err := q.QueryRow(ctx, `
		SELECT seq FROM mefor_work WHERE lane = $1 AND status = 'pending' ORDER BY seq LIMIT 1`, lane).Scan(&head)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("check lane %s: %w", lane, err)
	}
	return true, nil
}
