package pipeline

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// resealSQL writes re-sealed values (package rotation re-seals them) of
// each id-keyed sealed column of the pipeline's tables: $1 the rows' ids,
// $2 their values.
var resealSQL = func() map[string]string {
	m := map[string]string{}
	for _, c := range []struct{ table, column, typ string }{
		{"mefor_message", "raw", "bytea"},
		{"mefor_message", "patient_key", "text"},
		{"mefor_message", "error", "text"},
		{"mefor_work", "payload", "bytea"},
		{"mefor_work", "last_error", "text"},
		{"mefor_response", "body", "bytea"},
		{"mefor_event", "detail", "text"},
	} {
		m[c.table+"."+c.column] = fmt.Sprintf(`UPDATE %s t SET %s = u.v
		FROM unnest($1::bigint[], $2::%s[]) AS u(id, v) WHERE t.id = u.id`, c.table, c.column, c.typ)
	}
	return m
}()

// WriteResealed stores re-sealed values of column (table.column, one of
// resealSQL's) for the rows ids names, values being a []byte slice for a
// bytea column and a string slice for a text one. The caller holds the
// rows' locks: a value is rewritten only under its row's lock. It returns
// how many rows it wrote.
func WriteResealed(ctx context.Context, tx pgx.Tx, column string, ids []int64, values any) (int64, error) {
	sql, ok := resealSQL[column]
	if !ok {
		return 0, fmt.Errorf("re-seal %s: not a sealed column of the pipeline", column)
	}
	tag, err := tx.Exec(ctx, sql, ids, values)
	if err != nil {
		return 0, fmt.Errorf("re-seal %s: %w", column, err)
	}
	return tag.RowsAffected(), nil
}

// WriteResealedState stores re-sealed values of mefor_state.value for the
// rows namespaces and keys name, under the rows' locks the caller holds.
func WriteResealedState(ctx context.Context, tx pgx.Tx, namespaces, keys []string, values [][]byte) (int64, error) {
	tag, err := tx.Exec(ctx, `UPDATE mefor_state t SET value = u.v
		FROM unnest($1::text[], $2::text[], $3::bytea[]) AS u(namespace, key, v)
		WHERE t.namespace = u.namespace AND t.key = u.key`, namespaces, keys, values)
	if err != nil {
		return 0, fmt.Errorf("re-seal mefor_state.value: %w", err)
	}
	return tag.RowsAffected(), nil
}
