package pipeline

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// RecordHold records that a routed row at the head of its lane could not be
// transformed yet (a reference set without a snapshot, a script with
// on_error: hold): its attempts, the reason (never message content) and
// when to try again. The row stays pending, holding its lane. It checks ex's
// fence first, in tx.
func RecordHold(ctx context.Context, tx pgx.Tx, ex Execution, row Row, reason string, retryIn time.Duration) error {
	if !ex.unfenced() {
		if err := Fence(ctx, tx, ex); err != nil {
			return err
		}
	}
	_, err := tx.Exec(ctx, `
		UPDATE mefor_work SET attempts = attempts + 1, last_error = $2,
			next_attempt_at = clock_timestamp() + make_interval(secs => $3::float8),
			updated_at = clock_timestamp()
		WHERE id = $1 AND status = `+PendingByID, row.ID, ex.Keys.SealString(ColError, MessageRow(row.MessageID), reason), retryIn.Seconds())
	if err != nil {
		return fmt.Errorf("record hold of row %d: %w", row.ID, err)
	}
	return nil
}
