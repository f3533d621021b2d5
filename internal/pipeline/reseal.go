package pipeline

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// resealSQL writes re-sealed values (package rotation re-seals them) of
// each id-keyed sealed column of the pipeline's tables: $1 the rows' ids,
// $2 their values.
var resealSQL = map[string]string{
	"mefor_message.raw": `UPDATE mefor_message t SET raw = u.v
		FROM unnest($1::bigint[], $2::bytea[]) AS u(id, v) WHERE t.id = u.id`,
	"mefor_message.patient_key": `UPDATE mefor_message t SET patient_key = u.v
		FROM unnest($1::bigint[], $2::text[]) AS u(id, v) WHERE t.id = u.id`,
	"mefor_message.error": `UPDATE mefor_message t SET error = u.v
		FROM unnest($1::bigint[], $2::text[]) AS u(id, v) WHERE t.id = u.id`,
	"mefor_work.payload": `UPDATE mefor_work t SET payload = u.v
		FROM unnest($1::bigint[], $2::bytea[]) AS u(id, v) WHERE t.id = u.id`,
	"mefor_work.last_error": `UPDATE mefor_work t SET last_error = u.v
		FROM unnest($1::bigint[], $2::text[]) AS u(id, v) WHERE t.id = u.id`,
	"mefor_response.body": `UPDATE mefor_response t SET body = u.v
		FROM unnest($1::bigint[], $2::bytea[]) AS u(id, v) WHERE t.id = u.id`,
	"mefor_event.detail": `UPDATE mefor_event t SET detail = u.v
		FROM unnest($1::bigint[], $2::text[]) AS u(id, v) WHERE t.id = u.id`,
}

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
