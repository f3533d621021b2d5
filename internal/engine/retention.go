package engine

import (
	"context"
	"time"

	"github.com/mefor/mefor/internal/nodeinfo"
)

// recordRetention writes the node's retention policy to its row for `mefor
// status`. A failure is logged and left for the next reload or start, as
// recordTransport's is.
func (n *Node) recordRetention(ctx context.Context) {
	r := n.Config().Maintenance.Retention
	if r == nil {
		return
	}
	sec := func(d time.Duration) int64 { return int64(d / time.Second) }
	rec := nodeinfo.Retention{
		KeepBodiesSeconds: sec(r.KeepBodies), KeepDeadSeconds: sec(r.KeepDead), KeepErrorsSeconds: sec(r.KeepErrors),
		KeepErrorsDefault: !r.KeepErrorsGiven, DeleteAfterSeconds: sec(r.DeleteAfter),
	}
	if err := nodeinfo.RecordRetention(ctx, n.opts.Pool, n.opts.NodeID, rec); err != nil {
		n.logger.WarnContext(ctx, "could not record the retention policy for mefor status", "error", err)
	}
}
