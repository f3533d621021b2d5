package search

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/pipeline"
)

// OutboundChannels lists the channels that have outbound rows of status
// (pending or dead) for destination (every destination when empty), from
// the status counts: a scoped person's bulk action runs once per channel
// of theirs among them, so it never touches another channel's rows.
func OutboundChannels(ctx context.Context, q pipeline.DBTX, destination, status string) ([]string, error) {
	rows, err := q.Query(ctx, `
		SELECT channel FROM mefor_work_count
		WHERE stage = 'outbound' AND status = $2 AND ($1 = '' OR destination = $1)
		GROUP BY channel HAVING sum(n) > 0 ORDER BY channel`, destination, status)
	if err != nil {
		return nil, fmt.Errorf("list channels with %s outbound rows: %w", status, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("list channels with %s outbound rows: %w", status, err)
	}
	return out, nil
}

// MessageChannel is the channel of message id; pipeline.ErrNotFound when
// there is no such message.
func MessageChannel(ctx context.Context, q pipeline.DBTX, id int64) (string, error) {
	var channel string
	err := q.QueryRow(ctx, `SELECT channel FROM mefor_message WHERE id = $1`, id).Scan(&channel)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", pipeline.ErrNotFound
	}
	if err != nil {
		return "", fmt.Errorf("read the channel of message %d: %w", id, err)
	}
	return channel, nil
}
