package nodeinfo

import (
	"context"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
)

// Retention is the retention policy a node runs with (maintenance.retention
// of its file, defaults applied), each window in whole seconds, 0 for
// never.
type Retention struct {
	KeepBodiesSeconds int64 `json:"keep_bodies_seconds"`
	KeepDeadSeconds   int64 `json:"keep_dead_seconds"`
	KeepErrorsSeconds int64 `json:"keep_errors_seconds"`
	// KeepErrorsDefault: the file does not set keep_errors.
	KeepErrorsDefault  bool  `json:"keep_errors_default"`
	DeleteAfterSeconds int64 `json:"delete_after_seconds"`
}

// RecordRetention replaces what the node's row says about its retention
// policy.
func RecordRetention(ctx context.Context, q pipeline.DBTX, nodeID string, r Retention) error {
	_, err := q.Exec(ctx, `
		INSERT INTO mefor_node_retention (node_id, keep_bodies, keep_dead, keep_errors, keep_errors_default, delete_after)
		VALUES ($1, NULLIF($2, 0), NULLIF($3, 0), NULLIF($4, 0), $5, NULLIF($6, 0))
		ON CONFLICT (node_id) DO UPDATE SET keep_bodies = EXCLUDED.keep_bodies, keep_dead = EXCLUDED.keep_dead,
			keep_errors = EXCLUDED.keep_errors, keep_errors_default = EXCLUDED.keep_errors_default,
			delete_after = EXCLUDED.delete_after, recorded_at = clock_timestamp()`,
		nodeID, r.KeepBodiesSeconds, r.KeepDeadSeconds, r.KeepErrorsSeconds, r.KeepErrorsDefault, r.DeleteAfterSeconds)
	if err != nil {
		return fmt.Errorf("record the retention policy of node %s: %w", nodeID, err)
	}
	return nil
}

// RetentionInUse is a retention policy and the live nodes that run it.
type RetentionInUse struct {
	Retention
	Nodes []string `json:"nodes"`
}

// ReadRetentionStatus returns the policies the live nodes recorded, the
// one most nodes run first; one entry when they agree.
func ReadRetentionStatus(ctx context.Context, q pipeline.DBTX) ([]RetentionInUse, error) {
	recs, err := readLive(ctx, q, "read retention policies", `
		SELECT node_id, coalesce(keep_bodies, 0), coalesce(keep_dead, 0), coalesce(keep_errors, 0),
			keep_errors_default, coalesce(delete_after, 0)
		FROM mefor_node_retention WHERE node_id = ANY($1)
		ORDER BY node_id`, func(row pgx.CollectableRow) (string, Retention, error) {
		var node string
		var r Retention
		err := row.Scan(&node, &r.KeepBodiesSeconds, &r.KeepDeadSeconds, &r.KeepErrorsSeconds,
			&r.KeepErrorsDefault, &r.DeleteAfterSeconds)
		return node, r, err
	})
	if err != nil {
		return nil, err
	}
	out := []RetentionInUse{}
	for _, rec := range recs {
		i := entryFor(&out, func(o RetentionInUse) bool { return o.Retention == rec.v },
			func() RetentionInUse { return RetentionInUse{Retention: rec.v} })
		out[i].Nodes = append(out[i].Nodes, rec.node)
	}
	slices.SortStableFunc(out, func(a, b RetentionInUse) int { return len(b.Nodes) - len(a.Nodes) })
	return out, nil
}
