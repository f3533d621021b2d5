package search

import (
	"context"
	"fmt"
	"strings"

	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/jobs"
)

// Backlog is the cluster's pending work as the metrics and alerts read it.
type Backlog struct {
	// Groups holds one entry per stage, channel and destination with
	// pending rows (Destination is empty for ingress and routed rows).
	Groups []BacklogGroup
	// Destinations and Channels are every destination and channel that
	// ever had a lane, so a drained queue reads 0 instead of vanishing.
	Destinations []string
	Channels     []string
	// RiverLeader is the id of River's live leader, "" when none.
	RiverLeader string
}

// BacklogGroup is the pending rows of one stage, channel and destination.
type BacklogGroup struct {
	Stage       string
	Channel     string
	Destination string
	Pending     int64
	// OldestSeconds is the age of the oldest pending row, by the database
	// clock.
	OldestSeconds float64
}

// ReadBacklog reads the pending rows grouped by stage, channel and
// destination: their counts from the summary counts and the oldest of each
// group from the partial index on pending rows (pendingGroupsSQL), so its
// cost follows the number of groups, not the backlog or the history kept;
// the lane registry supplies the names with nothing pending.
func ReadBacklog(ctx context.Context, q pipeline.DBTX) (*Backlog, error) {
	b := &Backlog{}
	var err error
	if b.Groups, err = readPendingGroups(ctx, q); err != nil {
		return nil, err
	}
	lanes, err := jobs.LaneNames(ctx, q)
	if err != nil {
		return nil, err
	}
	seenD, seenC := map[string]bool{}, map[string]bool{}
	for _, lane := range lanes {
		stage, name, _ := strings.Cut(lane, ":")
		switch stage {
		case jobs.StageOutbound:
			name, _, _ = strings.Cut(name, "#")
			if !seenD[name] {
				seenD[name] = true
				b.Destinations = append(b.Destinations, name)
			}
		case jobs.StageIngress, jobs.StageRouted:
			if !seenC[name] {
				seenC[name] = true
				b.Channels = append(b.Channels, name)
			}
		}
	}
	err = q.QueryRow(ctx, `SELECT coalesce((SELECT leader_id FROM river_leader WHERE expires_at > now() LIMIT 1), '')`).Scan(&b.RiverLeader)
	if err != nil {
		return nil, fmt.Errorf("read River leader: %w", err)
	}
	return b, nil
}

// BacklogSQL is the statement ReadBacklog groups pending rows with, for
// EXPLAIN in benchmarks.
func BacklogSQL() string { return pendingGroupsSQL }
