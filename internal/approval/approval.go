// Package approval owns mefor_approval: dual control for the API's
// actions. An action that access.approvals.required_for names is not run
// when asked for; it is stored here, pending, until a second person who
// holds its permission approves or rejects it, or it expires.
//
// # The model
//
// A request moves pending -> running -> done or failed, or pending ->
// rejected, each move one UPDATE under the row's lock that checks the state
// it moves from. So of two approvers racing, one moves the row to running
// and runs the action, the other finds it no longer pending and is refused:
// the action runs at most once. Claiming and running are not one
// transaction (a bulk replay commits in many), so a node that dies after
// the claim leaves the row running, the action perhaps half done: it is
// never run again by this package, and the audit rows of the batches that
// committed say what happened.
//
// The person who asked can never decide their own request (checked here,
// and by the table's constraint). A pending request past its expiry cannot
// be claimed. Every request and decision appends an audit row naming the
// person acting, in the same transaction; a refused decision appends a
// denied row. Who may decide (the permission, a fresh re-authentication)
// is the API's check; this package checks what holds whoever asks.
package approval

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
)

// States of a request.
const (
	StatePending  = "pending"
	StateRejected = "rejected"
	StateRunning  = "running"
	StateDone     = "done"
	StateFailed   = "failed"
	// StateExpired is shown for a pending request past its expiry; it is
	// not stored.
	StateExpired = "expired"
)

// Refusals of a decision, each with its predicate below.
var (
	// ErrNotFound is an approval id that does not exist.
	ErrNotFound = errors.New("no such approval")
	// ErrOwnRequest is a decision by the person who asked.
	ErrOwnRequest = errors.New("the person who asked for an action cannot approve or reject it; another person who holds its permission must")
	// ErrExpired is a decision on a request past its expiry.
	ErrExpired = errors.New("the request expired; ask again")
	// ErrDecided is a decision on a request no longer pending: approved
	// (and run) or rejected already.
	ErrDecided = errors.New("the request was already decided")
)

// IsRefused reports whether err is a decision this package refused (as
// opposed to one that failed).
func IsRefused(err error) bool {
	return errors.Is(err, ErrOwnRequest) || errors.Is(err, ErrExpired) || errors.Is(err, ErrDecided)
}

// Approval is one request.
type Approval struct {
	ID     int64           `json:"id"`
	Action string          `json:"action"`
	Params json.RawMessage `json:"params"`
	// RequestedBy is the person who asked; RequestedChannels their channel
	// patterns then (empty: every channel).
	RequestedBy       string    `json:"requested_by"`
	RequestedChannels []string  `json:"requested_channels"`
	RequestedSource   string    `json:"requested_source,omitempty"`
	RequestedAt       time.Time `json:"requested_at"`
	ExpiresAt         time.Time `json:"expires_at"`
	// State is pending, expired (pending past ExpiresAt), rejected,
	// running, done or failed.
	State         string          `json:"state"`
	DecidedBy     *string         `json:"decided_by,omitempty"`
	DecidedSource *string         `json:"decided_source,omitempty"`
	DecidedAt     *time.Time      `json:"decided_at,omitempty"`
	Result        json.RawMessage `json:"result,omitempty"`
	Error         *string         `json:"error,omitempty"`
	FinishedAt    *time.Time      `json:"finished_at,omitempty"`
}

// Person is who asks or decides.
type Person struct {
	Name     string
	Channels []string
	Source   string
}

// Options configure a Store.
type Options struct {
	// Expire is how long a request waits for a decision. Defaults to 24h
	// (access.approvals.expire).
	Expire time.Duration
	// Now is the clock requests are stamped and expired by. Defaults to
	// time.Now.
	Now func() time.Time
}

// Store reads and writes requests; it is the only writer of
// mefor_approval.
type Store struct {
	db   *pgxpool.Pool
	opts Options
}

// New returns a Store on pool.
func New(pool *pgxpool.Pool, opts Options) *Store {
	if opts.Expire <= 0 {
		opts.Expire = 24 * time.Hour
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Store{db: pool, opts: opts}
}

const columns = `id, action, params, requested_by, requested_channels, requested_source, requested_at, expires_at, state,
	decided_by, decided_source, decided_at, result, error, finished_at`

func (s *Store) scan(r pgx.Row) (Approval, error) {
	var a Approval
	err := r.Scan(&a.ID, &a.Action, &a.Params, &a.RequestedBy, &a.RequestedChannels, &a.RequestedSource, &a.RequestedAt,
		&a.ExpiresAt, &a.State, &a.DecidedBy, &a.DecidedSource, &a.DecidedAt, &a.Result, &a.Error, &a.FinishedAt)
	if err == nil && a.State == StatePending && !s.opts.Now().Before(a.ExpiresAt) {
		a.State = StateExpired
	}
	if a.RequestedChannels == nil {
		a.RequestedChannels = []string{}
	}
	return a, err
}

// Request stores a pending request of action (a permission name) with
// params, asked by who, and audits it (approval-request) naming them.
func (s *Store) Request(ctx context.Context, action string, params any, who Person) (Approval, error) {
	p, err := json.Marshal(params)
	if err != nil {
		return Approval{}, fmt.Errorf("encode the parameters of %s: %w", action, err)
	}
	channels := who.Channels
	if channels == nil {
		channels = []string{}
	}
	now := s.opts.Now()
	var a Approval
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		a, err = s.scan(tx.QueryRow(ctx, `
			INSERT INTO mefor_approval (action, params, requested_by, requested_channels, requested_source, requested_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING `+columns,
			action, p, who.Name, channels, who.Source, now, now.Add(s.opts.Expire)))
		if err != nil {
			return fmt.Errorf("store the request of %s: %w", action, err)
		}
		return audit.Append(ctx, tx, audit.Entry{Action: audit.ActionApprovalRequest, Actor: who.Name, Outcome: audit.OutcomeRequested,
			Target: map[string]any{"approval_id": a.ID, "action": action, "params": a.Params, "expires_at": a.ExpiresAt}})
	})
	return a, err
}

// Get reads request id.
func (s *Store) Get(ctx context.Context, id int64) (Approval, error) {
	a, err := s.scan(s.db.QueryRow(ctx, `SELECT `+columns+` FROM mefor_approval WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, ErrNotFound
	}
	if err != nil {
		return Approval{}, fmt.Errorf("read approval %d: %w", id, err)
	}
	return a, nil
}

// Filter narrows List.
type Filter struct {
	// State keeps one state (expired: pending past expiry; pending: not
	// yet expired). Defaults to every state.
	State string
	// Actions keeps these actions only. Defaults to every action.
	Actions []string
	// Limit bounds the rows. Defaults to 100.
	Limit int
}

// List returns requests, newest first.
func (s *Store) List(ctx context.Context, f Filter) ([]Approval, error) {
	if f.Limit <= 0 {
		f.Limit = 100
	}
	now := s.opts.Now()
	rows, err := s.db.Query(ctx, `SELECT `+columns+` FROM mefor_approval
		WHERE ($1 = '' OR ($1 = 'pending' AND state = 'pending' AND expires_at > $4)
			OR ($1 = 'expired' AND state = 'pending' AND expires_at <= $4) OR ($1 NOT IN ('pending', 'expired') AND state = $1))
		  AND ($2::text[] IS NULL OR action = ANY($2))
		ORDER BY id DESC LIMIT $3`, f.State, f.Actions, f.Limit, now)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Approval, error) { return s.scan(r) })
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return out, nil
}

// Decide approves or rejects request id as who. An approval moves it to
// running, and the caller runs the action and reports how it ended with
// Finish. A request of who's own is ErrOwnRequest, one past its expiry
// ErrExpired, one no longer pending ErrDecided; each refusal is audited
// as denied. The row's lock and the state it moves from make the claim
// happen once however many approvers race.
func (s *Store) Decide(ctx context.Context, id int64, approve bool, who Person) (Approval, error) {
	action, state := audit.ActionApprovalReject, StateRejected
	if approve {
		action, state = audit.ActionApprovalApprove, StateRunning
	}
	var (
		a       Approval
		refusal error
	)
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var err error
		a, err = s.scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM mefor_approval WHERE id = $1 FOR UPDATE`, id))
		if errors.Is(err, pgx.ErrNoRows) {
			return ErrNotFound
		}
		if err != nil {
			return fmt.Errorf("read approval %d: %w", id, err)
		}
		target := map[string]any{"approval_id": id, "action": a.Action, "params": a.Params, "requested_by": a.RequestedBy}
		switch {
		case a.RequestedBy == who.Name:
			refusal = ErrOwnRequest
		case a.State == StateExpired:
			refusal = ErrExpired
		case a.State != StatePending:
			refusal = ErrDecided
		}
		if refusal != nil {
			target["error"], target["state"] = refusal.Error(), a.State
			return audit.Append(ctx, tx, audit.Entry{Action: action, Actor: who.Name, Outcome: audit.OutcomeDenied, Target: target})
		}
		a, err = s.scan(tx.QueryRow(ctx, `
			UPDATE mefor_approval SET state = $2, decided_by = $3, decided_source = $4, decided_at = $5
			WHERE id = $1 AND state = 'pending' RETURNING `+columns, id, state, who.Name, who.Source, s.opts.Now()))
		if err != nil {
			return fmt.Errorf("decide approval %d: %w", id, err)
		}
		return audit.Append(ctx, tx, audit.Entry{Action: action, Actor: who.Name, Target: target})
	})
	if err != nil {
		return Approval{}, err
	}
	if refusal != nil {
		return a, fmt.Errorf("approval %d: %w", id, refusal)
	}
	return a, nil
}

// Finish records how a claimed request's action ended: its result, or
// runErr. Only a running request moves, so it is recorded once.
func (s *Store) Finish(ctx context.Context, id int64, result any, runErr error) (Approval, error) {
	state, msg := StateDone, (*string)(nil)
	if runErr != nil {
		state = StateFailed
		m := runErr.Error()
		msg = &m
	}
	var res []byte
	if result != nil {
		b, err := json.Marshal(result)
		if err != nil {
			return Approval{}, fmt.Errorf("encode the result of approval %d: %w", id, err)
		}
		res = b
	}
	a, err := s.scan(s.db.QueryRow(ctx, `
		UPDATE mefor_approval SET state = $2, result = $3, error = $4, finished_at = now()
		WHERE id = $1 AND state = 'running' RETURNING `+columns, id, state, res, msg))
	if errors.Is(err, pgx.ErrNoRows) {
		return Approval{}, fmt.Errorf("finish approval %d: %w", id, ErrDecided)
	}
	if err != nil {
		return Approval{}, fmt.Errorf("finish approval %d: %w", id, err)
	}
	return a, nil
}

// String names a request in errors and logs: its id and action, never its
// parameters' values.
func (a Approval) String() string {
	return "approval " + strconv.FormatInt(a.ID, 10) + " (" + a.Action + ")"
}
