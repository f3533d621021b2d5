package retention

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/mefor/mefor/internal/nodeinfo"
	"github.com/mefor/mefor/internal/pipeline"
)

// OldestRetainedBody is when the oldest message whose body is still kept was
// received; ok is false when no body is kept.
func OldestRetainedBody(ctx context.Context, db pipeline.DBTX) (at time.Time, ok bool, err error) {
	err = db.QueryRow(ctx, `
		SELECT received_at FROM mefor_message WHERE body_purged_at IS NULL ORDER BY id LIMIT 1`).Scan(&at)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, false, nil
	}
	if err != nil {
		return time.Time{}, false, fmt.Errorf("read oldest retained body: %w", err)
	}
	return at, true, nil
}

// Status is what `mefor status` shows of retention.
type Status struct {
	// OldestBodyAt is when the oldest message whose body is still kept
	// was received; nil when no body is kept.
	OldestBodyAt *time.Time `json:"oldest_body_at,omitempty"`
	// OldestBodyAgeSeconds is its age by the database clock.
	OldestBodyAgeSeconds *float64 `json:"oldest_body_age_seconds,omitempty"`
	// Policies are the retention policies the live nodes run with, the
	// one most run first; one when they agree.
	Policies []nodeinfo.RetentionInUse `json:"policies"`
}

// ReadStatus reads the live nodes' retention policies, and the oldest
// retained body and its age.
func ReadStatus(ctx context.Context, db pipeline.DBTX) (Status, error) {
	var rs Status
	var err error
	if rs.Policies, err = nodeinfo.ReadRetentionStatus(ctx, db); err != nil {
		return rs, err
	}
	err = db.QueryRow(ctx, `
		SELECT received_at, extract(epoch FROM clock_timestamp() - received_at)::float8
		FROM mefor_message WHERE body_purged_at IS NULL ORDER BY id LIMIT 1`).Scan(&rs.OldestBodyAt, &rs.OldestBodyAgeSeconds)
	if errors.Is(err, pgx.ErrNoRows) {
		return rs, nil
	}
	if err != nil {
		return rs, fmt.Errorf("read oldest retained body: %w", err)
	}
	return rs, nil
}
