package workers

import (
	"context"

	"github.com/mefor/mefor/internal/config"
	"github.com/mefor/mefor/internal/pipeline"
)

// purgeState deletes transform state untouched for keep_state, a batch per
// statement (each its own transaction), and returns how many it deleted.
// Nodes' caches may still hold a purged value: the hand-off's version check
// finds it gone and the batch runs again on the truth.
func purgeState(ctx context.Context, d *Deps, p *config.Retention) (int, error) {
	total := 0
	for {
		n, err := pipeline.PurgeState(ctx, d.Pool, p.KeepState, p.BatchSize)
		total += n
		if err != nil || n < p.BatchSize {
			return total, err
		}
	}
}
