package nodeinfo

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/mefor/mefor/internal/dbpool"
	"github.com/mefor/mefor/internal/pipeline"
	"github.com/mefor/mefor/leader"
)

// recorded is what one node recorded.
type recorded[T any] struct {
	node string
	v    T
}

// readLive reads what the live nodes (leader.LiveNodes) recorded: sql
// selects the rows of the nodes whose ids are in $1, by node id, and scan
// reads a row's node id and value. what names the read in its errors.
func readLive[T any](ctx context.Context, q pipeline.DBTX, what, sql string, scan func(pgx.CollectableRow) (node string, v T, err error)) ([]recorded[T], error) {
	live, err := leader.LiveNodes(ctx, q)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return dbpool.Rows(ctx, q, what, func(r pgx.CollectableRow) (recorded[T], error) {
		node, v, err := scan(r)
		return recorded[T]{node: node, v: v}, err
	}, sql, live)
}

// entryFor is the index in list of the entry same holds, appending made()
// when none does: where a node's record joins the nodes that recorded the
// same.
func entryFor[E any](list *[]E, same func(E) bool, made func() E) int {
	if i := slices.IndexFunc(*list, same); i >= 0 {
		return i
	}
	*list = append(*list, made())
	return len(*list) - 1
}

// jsonColumn is a JSON column a node recorded, what it holds and where it
// decodes to.
type jsonColumn struct {
	what string
	data []byte
	into any
}

// decodeJSON decodes node's columns in turn; the first that does not
// decode is the error, naming the node and what the column holds.
func decodeJSON(node string, cols ...jsonColumn) error {
	for _, c := range cols {
		if err := json.Unmarshal(c.data, c.into); err != nil {
			return fmt.Errorf("node %s %s: %w", node, c.what, err)
		}
	}
	return nil
}
