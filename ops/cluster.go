package ops

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/mefor/mefor/internal/audit"
	"github.com/mefor/mefor/leader"
)

// Node is one row of the cluster's node listing.
type Node = leader.Node

// Node statuses.
const (
	NodeActive = leader.NodeActive
	NodeStale  = leader.NodeStale
	NodeLeft   = leader.NodeLeft
)

// ClusterStatus is the cluster part of `mefor status` and /cluster/status.
type ClusterStatus = leader.ClusterStatus

// ListNodes returns every node that ever joined, by id.
func ListNodes(ctx context.Context, pool *pgxpool.Pool) ([]Node, error) {
	return leader.ListNodes(ctx, pool)
}

// GetClusterStatus reads the lease, River's leader and the node counts from
// one snapshot.
func GetClusterStatus(ctx context.Context, pool *pgxpool.Pool) (ClusterStatus, error) {
	return readValue(ctx, pool, leader.ReadClusterStatus)
}

// StepdownRequest says which node should release the listener lease.
type StepdownRequest struct {
	// Node addresses a node; "" means whichever node holds the lease now.
	Node string
	// Timeout bounds the wait for the node's answer (and, with WaitForNew,
	// for a new holder).
	Timeout time.Duration
	// WaitForNew waits, after a release, until another node holds the lease.
	WaitForNew bool
	// Poll is how often the answer is looked for. Defaults to 100ms.
	Poll time.Duration
}

// StepdownAnswer is what the addressed node did, as it audited it.
type StepdownAnswer struct {
	RequestID  int64      `json:"request_id,omitempty"`
	Outcome    string     `json:"outcome"`
	Node       string     `json:"node"`
	WasHolder  bool       `json:"was_holder"`
	ReleasedAt *time.Time `json:"released_at"`
	Reason     string     `json:"reason,omitempty"`
	// Holder is the node holding the lease when the answer was written.
	Holder string `json:"holder"`
	// NewHolder is the node that took the lease over (WaitForNew only).
	NewHolder string `json:"new_holder,omitempty"`
}

// Outcomes of a stepdown as the node answers it (see leader.Lease.StepDown).
const (
	OutcomeReleased           = leader.OutcomeReleased
	OutcomeNotHolder          = leader.OutcomeNotHolder
	OutcomeLockTimeout        = leader.OutcomeLockTimeout
	OutcomeReleaseUnconfirmed = leader.OutcomeReleaseUnconfirmed
)

// Outcomes the CLI adds to the node's own ones.
const (
	OutcomeNoHolder = "no-holder"
	OutcomeNoAnswer = "no-answer"
	OutcomeNotLive  = "not-live"
)

// RequestStepdown asks a node, through the database, to release the
// listener lease, and waits for its answer. A request nobody answered in
// time is withdrawn, so a node that comes back later does not act on it.
func RequestStepdown(ctx context.Context, pool *pgxpool.Pool, req StepdownRequest) (StepdownAnswer, error) {
	if req.Poll == 0 {
		req.Poll = 100 * time.Millisecond
	}
	holder, err := leader.LeaseHolder(ctx, pool, leader.ListenerLeaseKey)
	if err != nil {
		return StepdownAnswer{}, err
	}
	target := req.Node
	if target == "" {
		if holder == "" {
			return StepdownAnswer{Outcome: OutcomeNoHolder, Reason: "no node holds the listener lease"}, nil
		}
		target = holder
	}
	nodes, err := ListNodes(ctx, pool)
	if err != nil {
		return StepdownAnswer{}, err
	}
	live := false
	for _, n := range nodes {
		if n.ID == target && n.Status == NodeActive {
			live = true
		}
	}
	if !live {
		return StepdownAnswer{Outcome: OutcomeNotLive, Node: target, Holder: holder,
			Reason: fmt.Sprintf("node %q is not a live node (see 'mefor nodes')", target)}, nil
	}

	var id int64
	auditTarget := map[string]any{"node": target, "holder": holder}
	err = audited(ctx, pool, pgx.TxOptions{}, audit.ActionStepdown, auditTarget, func(tx pgx.Tx) (string, error) {
		var err error
		id, err = leader.SendRequestTx(ctx, tx, leader.RequestKindStepdown, target)
		auditTarget["request_id"] = id
		return audit.OutcomeRequested, err
	})
	if err != nil {
		return StepdownAnswer{}, err
	}

	deadline := time.Now().Add(req.Timeout)
	ans, answered, err := waitAnswer(ctx, pool, id, deadline, req.Poll)
	if err != nil {
		return StepdownAnswer{}, err
	}
	if !answered {
		return StepdownAnswer{RequestID: id, Outcome: OutcomeNoAnswer, Node: target, Holder: holder,
			Reason: fmt.Sprintf("node %q did not answer within %s", target, req.Timeout)}, nil
	}
	ans.RequestID = id
	if req.WaitForNew && ans.Outcome == leader.OutcomeReleased {
		for time.Now().Before(deadline) {
			h, err := leader.LeaseHolder(ctx, pool, leader.ListenerLeaseKey)
			if err != nil {
				return ans, err
			}
			if h != "" && h != target {
				ans.NewHolder = h
				break
			}
			select {
			case <-ctx.Done():
				return ans, ctx.Err()
			case <-time.After(req.Poll):
			}
		}
	}
	return ans, nil
}

// waitAnswer polls the request until it is answered or the deadline passes;
// then it withdraws a request still pending. One claimed but not answered
// is left alone: the node is acting on it, and its audit row will say how
// it ended.
func waitAnswer(ctx context.Context, pool *pgxpool.Pool, id int64, deadline time.Time, poll time.Duration) (StepdownAnswer, bool, error) {
	withdrawn := false
	for {
		status, out, err := leader.RequestAnswer(ctx, pool, id)
		if err != nil {
			return StepdownAnswer{}, false, err
		}
		if status == "answered" {
			var ans StepdownAnswer
			if err := json.Unmarshal(out, &ans); err != nil {
				return StepdownAnswer{}, false, fmt.Errorf("decode stepdown answer: %w", err)
			}
			return ans, true, nil
		}
		if withdrawn {
			return StepdownAnswer{}, false, nil
		}
		if time.Now().After(deadline) {
			// Withdraw, then read once more: the answer may have landed
			// between the last read and the withdrawal.
			if err := leader.WithdrawRequest(context.WithoutCancel(ctx), pool, id); err != nil {
				return StepdownAnswer{}, false, fmt.Errorf("withdraw stepdown request: %w", err)
			}
			withdrawn = true
			continue
		}
		select {
		case <-ctx.Done():
			return StepdownAnswer{}, false, ctx.Err()
		case <-time.After(poll):
		}
	}
}
