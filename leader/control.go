package leader

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
)

// ControlChannel is the NOTIFY channel operators' requests are announced on;
// the payload is the addressed node's id.
const ControlChannel = "mefor_control"

// RequestKindStepdown asks the addressed node to release the listener lease.
const RequestKindStepdown = "stepdown"

// requestMaxAge bounds how old a pending request may be and still be acted
// on: an operator whose command gave up long ago does not expect a node that
// comes back later to step down.
const requestMaxAge = time.Minute

// Control answers operator requests addressed to this node. Requests are rows
// in mefor_control_request; a NOTIFY wakes the node at once. The node looks
// at the table itself each time its listening connection (re)connects, which
// covers a notification sent while it was away, and every PollEvery on that
// same connection, which proves the connection alive: a listener whose
// connection died silently fails that poll and reconnects, instead of
// waiting for a notification that can no longer come. While it cannot
// listen it polls every heartbeat.
type Control struct {
	Pool      *pgxpool.Pool
	NodeID    string
	Lease     *Lease
	Heartbeat time.Duration
	// PollEvery is how often a listening node looks for requests without
	// being notified. Defaults to controlPollBeats heartbeats: well within
	// the 30s an operator's stepdown waits by default.
	PollEvery time.Duration
	Logger    *slog.Logger
}

// controlPollBeats is the default PollEvery, in heartbeats.
const controlPollBeats = 10

func (c *Control) pollEvery() time.Duration {
	if c.PollEvery > 0 {
		return c.PollEvery
	}
	return controlPollBeats * c.Heartbeat
}

// Run serves requests until ctx ends.
func (c *Control) Run(ctx context.Context) {
	failing := false
	for ctx.Err() == nil {
		err := c.listen(ctx, func() {
			if failing {
				failing = false
				c.Logger.InfoContext(ctx, "control listener reconnected")
			}
		})
		if ctx.Err() != nil {
			return
		}
		if !failing {
			// Once per outage: a database that stays away would otherwise
			// log this every heartbeat.
			failing = true
			c.Logger.WarnContext(ctx, "control listener failed; polling until it reconnects", "error", err)
		}
		_ = c.poll(ctx) // its failure is the outage just logged
		select {
		case <-ctx.Done():
		case <-time.After(c.Heartbeat):
		}
	}
}

// listen holds its own connection rather than one of the pool's, which the
// node's workers need.
func (c *Control) listen(ctx context.Context, connected func()) error {
	conn, err := pgx.ConnectConfig(ctx, c.Pool.Config().ConnConfig.Copy())
	if err != nil {
		return fmt.Errorf("connect for LISTEN: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+ControlChannel); err != nil {
		return fmt.Errorf("LISTEN %s: %w", ControlChannel, err)
	}
	connected()
	for {
		if err := c.pollOn(ctx, conn); err != nil {
			return err
		}
		wctx, cancel := context.WithTimeout(ctx, c.pollEvery())
		_, err := conn.WaitForNotification(wctx)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil && wctx.Err() == nil {
			return fmt.Errorf("wait for notification: %w", err)
		}
	}
}

type request struct {
	ID   int64
	Kind string
}

// poll claims and answers this node's pending requests, oldest first.
func (c *Control) poll(ctx context.Context) error { return c.pollOn(ctx, c.Pool) }

// pollOn is poll, claiming through db (the listening connection, so the
// claim doubles as its liveness check).
func (c *Control) pollOn(ctx context.Context, db DB) error {
	for ctx.Err() == nil {
		req, ok, err := c.claim(ctx, db)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		c.handle(ctx, req)
	}
	return nil
}

// claim abandons this node's requests past their age and claims the oldest
// other pending one, in one statement. Both halves judge age against the
// statement's start (now()), so no row falls in both.
func (c *Control) claim(ctx context.Context, db DB) (request, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, c.Heartbeat)
	defer cancel()
	var r request
	err := db.QueryRow(ctx, `
		WITH abandoned AS (
			UPDATE mefor_control_request SET status = 'abandoned', answered_at = clock_timestamp()
			WHERE target_node = $1 AND status = 'pending' AND requested_at < now() - $2::bigint * interval '1 microsecond'
		)
		UPDATE mefor_control_request SET status = 'claimed'
		WHERE id = (
			SELECT id FROM mefor_control_request
			WHERE target_node = $1 AND status = 'pending' AND requested_at >= now() - $2::bigint * interval '1 microsecond'
			ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
		RETURNING id, kind`, c.NodeID, requestMaxAge.Microseconds()).Scan(&r.ID, &r.Kind)
	if err == pgx.ErrNoRows {
		return request{}, false, nil
	}
	if err != nil {
		return request{}, false, fmt.Errorf("claim control request: %w", err)
	}
	return r, true, nil
}

func (c *Control) handle(ctx context.Context, req request) {
	switch req.Kind {
	case RequestKindStepdown:
		res := c.Lease.StepDown(ctx)
		c.Logger.InfoContext(ctx, "stepdown request answered", "request", req.ID,
			"outcome", res.Outcome, "was_holder", res.WasHolder)
		if err := c.answerStepdown(context.WithoutCancel(ctx), req.ID, res); err != nil {
			c.Logger.ErrorContext(ctx, "could not record the stepdown answer", "request", req.ID,
				"outcome", res.Outcome, "error", err)
		}
	default:
		if err := c.answer(context.WithoutCancel(ctx), req.ID, map[string]any{
			"outcome": "unsupported", "reason": fmt.Sprintf("this node does not handle %q requests", req.Kind),
		}); err != nil {
			c.Logger.WarnContext(ctx, "could not answer control request", "request", req.ID, "error", err)
		}
	}
}

// answerStepdown writes the audit row and the answer together.
func (c *Control) answerStepdown(ctx context.Context, id int64, res StepdownResult) error {
	holder, _ := LeaseHolder(ctx, c.Pool, ListenerLeaseKey)
	out := map[string]any{
		"outcome": res.Outcome, "node": c.NodeID, "was_holder": res.WasHolder,
		"released_at": res.ReleasedAt, "reason": res.Reason, "holder": holder,
	}
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.Lease.FenceTimeout())
	defer cancel()
	tx, err := c.Pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("record stepdown answer: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	_, err = tx.Exec(ctx, `
		WITH a AS (
			INSERT INTO mefor_stepdown_audit (request_id, node_id, outcome, was_holder, released_at, reason)
			VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''))
		)
		UPDATE mefor_control_request SET status = 'answered', answered_at = clock_timestamp(), outcome = $7
		WHERE id = $1`,
		id, c.NodeID, res.Outcome, res.WasHolder, res.ReleasedAt, res.Reason, body)
	if err != nil {
		return fmt.Errorf("record stepdown answer: %w", err)
	}
	err = audit.Append(ctx, tx, audit.Entry{Action: audit.ActionStepdown, Node: c.NodeID, Outcome: res.Outcome,
		Target: map[string]any{"request_id": id, "was_holder": res.WasHolder, "released": res.ReleasedAt != nil}})
	if err != nil {
		return fmt.Errorf("record stepdown answer: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("record stepdown answer: %w", err)
	}
	return nil
}

func (c *Control) answer(ctx context.Context, id int64, out map[string]any) error {
	body, err := json.Marshal(out)
	if err != nil {
		return err
	}
	_, err = c.Pool.Exec(ctx, `UPDATE mefor_control_request SET status = 'answered', answered_at = clock_timestamp(), outcome = $2 WHERE id = $1`, id, body)
	return err
}

// SendRequest records an operator request of kind for node target and
// notifies it, in one transaction, and returns the request's id.
func SendRequest(ctx context.Context, pool *pgxpool.Pool, kind, target string) (int64, error) {
	var id int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		id, err = SendRequestTx(ctx, tx, kind, target)
		return err
	})
	return id, err
}

// SendRequestTx is SendRequest in the caller's transaction (the node is
// notified when it commits).
func SendRequestTx(ctx context.Context, tx pgx.Tx, kind, target string) (int64, error) {
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO mefor_control_request (kind, target_node) VALUES ($1, $2) RETURNING id`,
		kind, target).Scan(&id); err != nil {
		return 0, fmt.Errorf("send %s request to node %s: %w", kind, target, err)
	}
	if _, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, ControlChannel, target); err != nil {
		return 0, fmt.Errorf("send %s request to node %s: %w", kind, target, err)
	}
	return id, nil
}

// RequestAnswer reads a request: its status (pending, claimed, answered or
// abandoned) and, once answered, the node's outcome (JSON).
func RequestAnswer(ctx context.Context, q DB, id int64) (status string, outcome []byte, err error) {
	err = q.QueryRow(ctx, `SELECT status, outcome FROM mefor_control_request WHERE id = $1`, id).Scan(&status, &outcome)
	if err != nil {
		return "", nil, fmt.Errorf("read control request %d: %w", id, err)
	}
	return status, outcome, nil
}

// WithdrawRequest abandons a request no node has claimed yet, so a node
// that comes back later does not act on it. A claimed request is left to
// the node acting on it.
func WithdrawRequest(ctx context.Context, q DB, id int64) error {
	if _, err := q.Exec(ctx, `
		UPDATE mefor_control_request SET status = 'abandoned', answered_at = clock_timestamp()
		WHERE id = $1 AND status = 'pending'`, id); err != nil {
		return fmt.Errorf("withdraw control request %d: %w", id, err)
	}
	return nil
}
