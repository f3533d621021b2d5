package jobs

import (
	"context"

	"github.com/mefor/mefor/internal/dbpool"
)

// The reads of the lane registry (mefor_lane) other packages need; lane.go
// holds the lane protocol's own statements.

// LayoutBarrierSQL is the lowest pending seq in the lanes of lane $1's
// destination that belong to another lane group (LaneGroup), that is,
// another layout generation. The lanes come from mefor_lane (a row per lane
// ever activated, few), each probed at its head.
const LayoutBarrierSQL = `
	SELECT min(h.seq) AS seq
	FROM mefor_lane l
	CROSS JOIN LATERAL (
		SELECT x.seq FROM mefor_work x WHERE x.lane = l.name AND x.status = 'pending' ORDER BY x.seq LIMIT 1
	) h
	WHERE l.stage = 'outbound'
	  AND split_part(split_part(l.name, '#', 1), '~', 1) = split_part(split_part($1, '#', 1), '~', 1)
	  AND split_part(l.name, '#', 1) <> split_part($1, '#', 1)`

// LaneNames are the names of every lane ever activated, sorted.
func LaneNames(ctx context.Context, db DB) ([]string, error) {
	return dbpool.Column[string](ctx, db, "read lanes", `SELECT name FROM mefor_lane ORDER BY name`)
}
